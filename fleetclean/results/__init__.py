"""Script output -> typed results: parse, report (table/JSON/CSV), run records."""
