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
    except Exception as exc:  # noqa: BLE001 - any connection error means "not yet"
        print(f"waiting for the database ({attempt + 1}/60): {exc}", file=sys.stderr)
        time.sleep(2)
else:
    sys.exit("database never became reachable")
PY
exec fisher-atlas migrate
