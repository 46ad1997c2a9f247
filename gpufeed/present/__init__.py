"""Front ends that present a diagnosis: the terminal summary (and, later, the report and monitor)."""
