"""SQL to data cube: cube definitions, query-vector translation, canonical backend SQL."""
