"""More than one process: torchrun's ranks agreeing on stops and saves, elastic worlds,
torchft replica groups."""
