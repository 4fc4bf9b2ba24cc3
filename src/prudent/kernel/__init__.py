"""The kernel: what a Run needs to exist (the Run, its RunContext, events, counters, stop
reasons, generators, the data position). It imports no plug-in."""
