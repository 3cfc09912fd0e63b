"""bulletin_board (see DESIGN.md)."""
