"""compiler: the ``tkcc`` CLI, the optimize loop, the fleet, acceptance and composition, the plan
artifact and report, drift-triggered recompile and the web UI. Nothing imports this package."""
