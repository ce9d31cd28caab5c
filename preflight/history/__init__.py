"""The audit history: every run kept as rows of an embedded SQLite database, and what is computed from it.

    db.py          the database: schema and migrations, recording a run, importing a JSON history
                   directory, retention, and the damage it survives (a second writer, a killed writer, a
                   full disk, a corrupt file)
    subjects.py    what a finding is about: the GPU serial, the HCA port or the node (the unit that recurs)
    queries.py     timelines, flapping nodes, lemons, repeat faults, failure rates, time between incidents
    escalation.py  the action ladder (reset -> reboot -> inspect) and the flap-proof drain policy
    render.py      `preflight history` as a table or JSON

Standard library only (sqlite3); the controller imports it, never a node.
"""
