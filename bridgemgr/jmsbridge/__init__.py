"""JMS bridges: the XML configuration (config), reading it (fetch), resolving its
connection factories (resolve) and checking it offline (check). The runtime (bridge,
links, connections, DMQ) joins this package in later issues."""
