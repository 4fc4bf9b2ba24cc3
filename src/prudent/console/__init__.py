"""The console: what a person watching the run sees.

::

    settings.py   ConsoleSettings: ``console:`` in prudent.yaml
    reporter.py   ConsoleReporter: a progress bar on a terminal, plain lines in a log
"""

from __future__ import annotations

from prudent.kernel.lazy import lazy_exports

__all__ = ["ConsoleReporter", "ConsoleSettings"]

__getattr__ = lazy_exports(__name__, {
    "ConsoleReporter": "prudent.console.reporter",
    "ConsoleSettings": "prudent.console.settings",
})
