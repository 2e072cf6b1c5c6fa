"""Finding moments: what was said (transcripts), shown (object labels) and written
(on-screen text) in every file, and the files' names."""
