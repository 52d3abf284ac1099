"""With RELAY_METRICS_TOKEN set, unauthenticated routes show only what an outsider may see: /readyz and a
store's 503 keep their status but not the database URL, SQL or worker errors; /api/quarantine needs the token."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from relay.store.database import normalise_url
from relay.testing import loopback_client

TOKEN = "metrics-token-0123456789"


def test_readyz_and_quarantine_show_internals_only_to_the_token(relay_factory, database_url):
    relay = relay_factory(database_url, metrics_token=TOKEN)
    operator = {"Authorization": f"Bearer {TOKEN}"}
    assert loopback_client().get(f"{relay.url}/api/quarantine", timeout=10).status_code == 401
    assert loopback_client().get(f"{relay.url}/api/quarantine", headers=operator, timeout=10).json() == []
    engine = create_engine(normalise_url(database_url))
    try:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE store_probes RENAME TO store_probes_gone"))
        outsider = loopback_client().get(f"{relay.url}/readyz", timeout=10)
        assert outsider.status_code == 503 and outsider.json()["status"] == "unavailable"
        shown = outsider.text
        assert "store_probes" not in shown and "SELECT" not in shown.upper() and "sqlite" not in shown
        assert "postgresql" not in shown and "RELAY_METRICS_TOKEN" in outsider.json()["detail"]
        inside = loopback_client().get(f"{relay.url}/readyz", headers=operator, timeout=10)
        assert inside.status_code == 503 and "store_probes" in inside.text
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE store_probes_gone RENAME TO store_probes"))
    finally:
        engine.dispose()
