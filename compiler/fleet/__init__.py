"""The fleet of fast-tier and slow-tier engines: local processes (``local``), Ray actors, isolated children."""
