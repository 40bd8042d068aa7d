"""The service's administrative front ends: the port mapper (``portmapper``), through
which clients find the host broker's services, and the admin command port."""
