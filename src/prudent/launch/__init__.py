"""Starting and watching the user's script: the launch spec a parent hands its child, the
one way to spawn it, ``prudent run``'s supervisor."""
