"""Front ends that present a run: the terminal summary, the HTML report, the Chrome trace and the
live ``watch`` screen. They read the run record and the analysis; none of them measures."""
