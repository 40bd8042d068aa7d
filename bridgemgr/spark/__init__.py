"""The data pipeline on Apache Spark: links as Structured Streaming queries (runner=spark,
``imqbridgemgr drain``) and the DMQ jobs (``imqbridgemgr dmq archive|report|redrive``)."""
