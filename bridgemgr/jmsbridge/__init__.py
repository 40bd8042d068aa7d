"""JMS bridges. Configuration: the XML (config), reading it (fetch), resolving its
connection factories (resolve). Runtime: the bridge and
its lifecycle (bridge, states), links (link) with their per-message steps (pipeline)
and unit of work (transfer: CLIENT_ACKNOWLEDGE or XA), connections (connections), the
DMQ pipeline (dmq), counters and the bridge's own log (counters, logs)."""
