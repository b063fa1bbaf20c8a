"""What people read about a run: plain-data views and dashboard tables (`views`), the one-file HTML report
(`html`) and its embedded charts (`charts`)."""
