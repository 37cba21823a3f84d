"""Storage: the only place that speaks SQL (connection, migrations, runs, journal, frames)."""
