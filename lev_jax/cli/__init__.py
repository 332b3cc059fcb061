"""The commands (console scripts); library code never imports this package."""
