"""traffic_profiles (see DESIGN.md)."""
