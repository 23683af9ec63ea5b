"""`tandem top --prometheus URL`: the same figures from Prometheus (what the chart's PodMonitor scrapes):
latency at each service's SLO percentile, attainment over 5 minutes, workers up, autoscaler's desired."""

from __future__ import annotations

import httpx

from tandem import names
from tandem.operator.top.view import PoolState, ServiceState

BY = "namespace, service"


class PrometheusSource:
    def __init__(self, url: str, namespace: str | None = None, window: str = "1m"):
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=10)
        self.window = window
        self.match = f'namespace="{namespace}"' if namespace else ""

    def _query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        body = self.http.get("/api/v1/query", params={"query": expr}).json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus: {body.get('error')} in {expr}")
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def poll(self) -> list[ServiceState]:
        m, w = self.match, self.window
        sel = "{" + m + "}"
        states: dict[tuple[str, str], ServiceState] = {}

        def get(labels: dict[str, str]) -> ServiceState:
            key = (labels.get("namespace", ""), labels["service"])
            return states.setdefault(key, ServiceState(key[1], key[0] or None))

        for labels, v in self._query(f"max by ({BY}) ({names.SLO_OBJECTIVE_RATIO}{sel})"):
            get(labels).objective = v
        for labels, v in self._query(f"max by ({BY}, slo) ({names.SLO_TARGET_SECONDS}{sel})"):
            st = get(labels)
            if labels.get("slo") == names.SLO_TTFT:
                st.slo_ttft_s = v
            elif labels.get("slo") == names.SLO_TPOT:
                st.slo_tpot_s = v
        for q in sorted({s.objective or 0.9 for s in states.values()} or {0.9}):
            for metric, field in ((names.TTFT_SECONDS, "ttft_s"), (names.TPOT_SECONDS, "tpot_s")):
                expr = f"histogram_quantile({q}, sum by ({BY}, le) (rate({metric}_bucket{sel}[{w}])))"
                for labels, v in self._query(expr):
                    st = get(labels)
                    if (st.objective or 0.9) == q and v == v:  # NaN: no requests in the window
                        setattr(st, field, v)
        met = "{" + ",".join(x for x in (m, 'met="true"') if x) + "}"
        for labels, v in self._query(
            f"sum by ({BY}, slo) (increase({names.SLO_REQUESTS_TOTAL}{met}[5m])) / "
            f"sum by ({BY}, slo) (increase({names.SLO_REQUESTS_TOTAL}{sel}[5m]))"
        ):
            if v == v:
                get(labels).attainment[labels["slo"]] = v
        for labels, v in self._query(f"sum by ({BY}) (rate({names.REQUESTS_TOTAL}{sel}[{w}]))"):
            get(labels).requests_per_s = v
        errors = "{" + ",".join(x for x in (m, 'status!~"2.."') if x) + "}"
        for labels, v in self._query(f"sum by ({BY}) (rate({names.REQUESTS_TOTAL}{errors}[{w}]))"):
            get(labels).errors_per_s = v
        up = "{" + ",".join(x for x in (m, 'pool=~"prefill|decode|colocated"') if x) + "}"
        for labels, v in self._query(f"sum by ({BY}, pool) (up{up})"):
            get(labels).pools.setdefault(labels["pool"], PoolState()).ready = int(v)
        for labels, v in self._query(f"max by ({BY}, pool) ({names.AUTOSCALER_DESIRED_REPLICAS}{sel})"):
            get(labels).pools.setdefault(labels["pool"], PoolState()).desired = int(v)
        return list(states.values())

    def close(self) -> None:
        self.http.close()
