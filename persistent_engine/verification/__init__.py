"""Verification that both sides of the judge/executor wall run: comparisons of outputs (``verify``), the
calibrated layer-level bound (``tolerance``), replayed sparse picks (``picks``), the guards around
candidate code (``guards``) and Triton's CPU interpreter check (``interpreter``). Imports nothing here,
so a process loads only the modules it uses."""
