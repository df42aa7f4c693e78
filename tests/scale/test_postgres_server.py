"""The Prefect server the scale tests use really runs on PostgreSQL, and the cluster is throwaway."""

from __future__ import annotations

import socket

from prefect import flow, get_client

from services.postgres import postgres_cluster


@flow(name="pg-probe")
def probe(n: int) -> int:
    return n * 2


def test_flow_runs_are_stored_in_the_postgresql_cluster_behind_the_server(pg_server, postgres):
    state = probe(21, return_state=True)

    assert state.result() == 42
    with get_client(sync_client=True) as client:
        run_id = client.read_flow_run(state.state_details.flow_run_id).id
    stored = postgres.psql(f"select state_type from flow_run where id = '{run_id}'")
    assert stored == "COMPLETED"
    assert postgres.psql("select version()").startswith("PostgreSQL")


def test_a_cluster_listens_on_loopback_only_and_leaves_nothing_behind():
    with postgres_cluster(database="scratch") as cluster:
        assert cluster.host == "127.0.0.1"
        assert cluster.psql("show listen_addresses") == "127.0.0.1"
        assert cluster.psql("select current_database()") == "scratch"
        assert cluster.psql("show data_directory").startswith(str(cluster.folder))
        assert list(cluster.folder.glob(".s.PGSQL.*")), "the unix socket lives in the cluster's own folder"
        folder, port = cluster.folder, cluster.port

    assert not folder.exists()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the server is stopped"
