"""The commands (console scripts); library code never imports this package.

Importing it makes a Ctrl-C while a command is still starting (loading jax, before its
`run`) one line and exit status 130, at once (lev_jax.cli.interrupt).
"""

from lev_jax.cli import interrupt as _interrupt

_interrupt.install_startup_handler()
