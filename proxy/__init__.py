"""dpproxy: a PostgreSQL proxy that answers aggregate queries under differential privacy."""
