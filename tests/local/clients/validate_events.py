"""Validate `podhost run --json` output against the shipped JSON Schema (the `jsonschema` package).

    python validate_events.py SCHEMA EVENTS_FILE

Prints one JSON list: for each line that is not a valid event, its number, the event's type and
the validator's messages. An empty list means every line is valid.
"""

import json
import sys

from jsonschema import Draft202012Validator

schema = json.load(open(sys.argv[1]))
Draft202012Validator.check_schema(schema)
validator = Draft202012Validator(schema)
problems = []
for n, line in enumerate(open(sys.argv[2]), start=1):
    try:
        event = json.loads(line)
    except json.JSONDecodeError as e:
        problems.append({"line": n, "type": None, "errors": [f"not JSON: {e}"]})
        continue
    errors = sorted(e.message for e in validator.iter_errors(event))
    if errors:
        problems.append({"line": n, "type": event.get("type"), "errors": errors})
print(json.dumps(problems))
