"""`python -m longswift` runs the CLI."""

from .cli import main_entry

main_entry()
