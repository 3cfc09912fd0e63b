"""The plan artifact (``artifact``), its writer, report and plots, composition, apply and compare."""
