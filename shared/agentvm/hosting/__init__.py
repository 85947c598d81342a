"""Session hosting: where a session's turns run and who publishes its events, locally and leased."""
