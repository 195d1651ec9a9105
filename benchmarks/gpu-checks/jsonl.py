"""The JSON lines of a gpu-checks output file, for the scripts' summaries: every line of
`out/name` that parses as a JSON object (other lines are logs), none when the file is missing."""
import json
import os


def rows(out, name):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        return []
    r = []
    for line in open(p):
        line = line.strip()
        if line.startswith("{"):
            try:
                r.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return r
