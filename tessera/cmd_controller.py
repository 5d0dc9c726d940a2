"""`tessera controller`: the admission webhook, the inventory cache and the controller's metrics."""

from __future__ import annotations

import argparse
import threading

from driver.shutdown import stop_on_signals, wait_for_stop
from tessera.celgates import add_feature_gates_argument, cel_environment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, then ~/.kube/config)")
    parser.add_argument("--tls-cert", required=True, help="PEM certificate of the webhook (reloaded when it changes)")
    parser.add_argument("--tls-key", required=True, help="PEM private key of the webhook")
    parser.add_argument("--listen", default=":8443", help="HOST:PORT of the HTTPS webhook (default :8443)")
    parser.add_argument("--metrics-addr", default=":9401", help="HOST:PORT of /metrics (default :9401; empty: off)")
    parser.add_argument("--probe-addr", default="",
                        help="HOST:PORT of plain-HTTP /healthz and /readyz for kubelet's probes, apart from the "
                             "reviews (the chart: :8081; default empty: only on the webhook port)")
    parser.add_argument("--client-ca", default="",
                        help="PEM CA file: require every webhook caller to present a client certificate it signed "
                             "(the apiserver's, from its AdmissionConfiguration; reloaded when it changes)")
    parser.add_argument("--on-deadline", choices=("deny", "allow"), default="deny",
                        help="answer for a review cut short at its deadline: deny (an HTTP 503, so failurePolicy "
                             "Fail refuses it as on a timeout; default) or allow with a warning (Ignore)")
    parser.add_argument("--max-concurrent-reviews", type=int, default=4,
                        help="reviews evaluated at once (default 4); 64 more may wait for a slot, and more get "
                             "an HTTP 503 (the apiserver retries, then applies failurePolicy)")
    parser.add_argument("--max-reviews-per-client", type=int, default=None,
                        help="running and waiting reviews one client address may hold; more get an HTTP 429 "
                             "(default: half of the running and waiting places)")
    add_feature_gates_argument(parser)
    parser.add_argument("--review-deadline", type=float, default=3.0,
                        help="seconds a review may take (default 3; less when the webhook's timeoutSeconds "
                             "leaves less than 1.5 s of margin)")


def run(args: argparse.Namespace) -> int:
    import ssl

    import structlog

    from controller.app import ControllerApp, parse_address
    from driver.kubeapi import RealKubeAPI

    log = structlog.get_logger("tessera.controller")
    try:
        listen = parse_address(args.listen, 8443)
        metrics = parse_address(args.metrics_addr, 9401) if args.metrics_addr else None
        probe = parse_address(args.probe_addr, 8081) if args.probe_addr else None
    except ValueError as exc:
        log.error("bad address", error=str(exc))
        return 2
    for flag, value in (("--max-concurrent-reviews", args.max_concurrent_reviews),
                        ("--max-reviews-per-client", args.max_reviews_per_client)):
        if value is not None and value < 1:
            log.error("bad webhook setting", error=f"{flag} must be at least 1, got {value}")
            return 2
    try:
        environment = cel_environment(args.feature_gates)
    except ValueError as exc:
        log.error("bad --feature-gates", error=str(exc))
        return 2
    try:
        api = RealKubeAPI(args.kubeconfig)
    except Exception as exc:  # the client raises ConfigException, OSError, YAML errors alike
        log.error("cannot load the Kubernetes client configuration", kubeconfig=args.kubeconfig, error=str(exc))
        return 1
    try:
        app = ControllerApp(
            api, tls_cert=args.tls_cert, tls_key=args.tls_key, listen=listen,
            metrics_addr=metrics, probe_addr=probe, client_ca=args.client_ca or None, on_deadline=args.on_deadline,
            max_reviews=args.max_concurrent_reviews, max_reviews_per_client=args.max_reviews_per_client,
            review_deadline_s=args.review_deadline, cel_environment=environment,
        )
    except ValueError as exc:
        log.error("bad webhook setting", error=str(exc))
        return 2
    except (OSError, ssl.SSLError) as exc:
        log.error("cannot start the webhook", error=str(exc), tls_cert=args.tls_cert, tls_key=args.tls_key,
                  client_ca=args.client_ca or None)
        return 1

    stop = threading.Event()
    stop_on_signals(stop)
    app.start()
    log.info("controller started", listen=args.listen, metrics=args.metrics_addr, probes=args.probe_addr or None,
             cel=environment.describe())
    wait_for_stop(stop)
    app.stop()
    return 0
