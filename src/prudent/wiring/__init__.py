"""``prudent.init``: the settings read once, the default components built, Store, RunContext
and Run wired together. The only modules that know every plug-in."""
