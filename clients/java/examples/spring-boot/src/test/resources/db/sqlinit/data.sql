-- One row per run of the scripts: the template's run made the only one.
INSERT INTO shelf (name) VALUES ('fiction');
