#!/usr/bin/env bash
# Wait for the database, then migrate it (run once before the api and worker start).
set -euo pipefail
python - <<'PY'
import os, sys, time
from sqlalchemy import create_engine, text
url = os.environ["FISHER_ATLAS_DATABASE_URL"]
for attempt in range(60):
    try:
        with create_engine(url).connect() as conn:
            conn.execute(text("SELECT 1"))
        break
    except Exception as exc:  # noqa: BLE001 - a connection error means "not yet" ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        permanent = ("does not exist", "password authentication failed", "no pg_hba.conf entry")
        if "FATAL" in first and any(p in first for p in permanent):  # ... but a wrong role or database never heals
            sys.exit(f"the database refuses this URL: {first}")
        print(f"waiting for the database ({attempt + 1}/60): {first}", file=sys.stderr)
        time.sleep(2)
else:
    sys.exit("database never became reachable")
PY
exec fisher-atlas migrate
