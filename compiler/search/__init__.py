"""The optimize loop and what it hands around: inputs, budget, judging, acceptance, run state, progress."""
