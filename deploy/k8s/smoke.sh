#!/usr/bin/env bash
# End-to-end smoke test of the kubernetes runner on a real cluster: what
# tests/e2e/test_kubernetes_runner.py does against localkube, here against your cluster.
#
# Airflow runs here (`airflow dags test`, SQLite in a temporary AIRFLOW_HOME) with
# TRAINYARD_RUNNER=kubernetes; every step, the training Jobs and TF Serving run on the
# cluster from the profile's images, through a kubeconfig of the trainyard-airflow service
# account (so the RBAC Role of rbac.yaml is what is tested). It prints each object as it
# appears or changes, checks that training left no Job, pod or Service, and asks the
# served model for a prediction through the serving Service.
#
# Before you run it (from the checkout, after `make setup`):
#   * kubectl's current context is the cluster; you may create objects in the namespace;
#   * the images are built from this checkout and pushed (deploy/k8s/README.md, "Images"),
#     and PROFILE (default deploy/cluster_profile.yaml) names them;
#   * the pipeline's source.url is readable from the step pods (an object store URL): the
#     shipped pipelines' relative .trainyard/raw/... paths exist on a laptop only, and the
#     pods read the pipeline files baked into the steps image;
#   * a GPU node of the pipeline's tier is free (or set gpus_per_worker: 0 in the pipeline).
#
# Usage: deploy/k8s/smoke.sh [digits|transactions]     (PROFILE=..., DAY=YYYY-MM-DD)
set -euo pipefail
cd "$(dirname "$0")/../.."
PIPELINE="${1:-digits}"
PROFILE="${PROFILE:-$PWD/deploy/cluster_profile.yaml}"
DAY="${DAY:-$(date -u +%F)}"
. scripts/env.sh
NS="$(python -c "from trainyard.k8s.profile import load_cluster_profile as l; print(l('$PROFILE').namespace)")"
MODEL="$(python -c "from trainyard.config import load_pipeline as l; print(l('$PIPELINE').serving.model_name)")"
KUEUE="$(python -c "from trainyard.k8s.profile import load_cluster_profile as l; print(l('$PROFILE').kueue.enabled)")"
WORK="$(mktemp -d)"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

echo "== the cluster's prerequisites, checked against $PROFILE, then applied"
python -m trainyard check-manifests --profile "$PROFILE" deploy/k8s
kubectl apply -f deploy/k8s/namespace.yaml -f deploy/k8s/rbac.yaml \
  -f deploy/k8s/priorityclasses.yaml -f deploy/k8s/storage.yaml
[ "$KUEUE" = True ] && kubectl apply -f deploy/k8s/kueue.yaml

echo "== a kubeconfig for the operators' service account (what Airflow's workers use)"
SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' \
  | base64 -d > "$WORK/ca.crt"
kubectl config --kubeconfig="$WORK/kubeconfig" set-cluster smoke --server="$SERVER" \
  --certificate-authority="$WORK/ca.crt" --embed-certs >/dev/null
kubectl config --kubeconfig="$WORK/kubeconfig" set-credentials smoke \
  --token="$(kubectl -n "$NS" create token trainyard-airflow --duration=2h)" >/dev/null
kubectl config --kubeconfig="$WORK/kubeconfig" set-context smoke --cluster=smoke \
  --user=smoke --namespace="$NS" >/dev/null
kubectl config --kubeconfig="$WORK/kubeconfig" use-context smoke >/dev/null

echo "== Airflow in $WORK (SQLite), the kubernetes runner, connection kubernetes_default"
export AIRFLOW_HOME="$WORK/airflow" TRAINYARD_RUNNER=kubernetes TRAINYARD_CLUSTER_PROFILE="$PROFILE"
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$WORK/airflow.db"
export AIRFLOW_CONN_KUBERNETES_DEFAULT="{\"conn_type\": \"kubernetes\", \"extra\": {\"kube_config_path\": \"$WORK/kubeconfig\", \"namespace\": \"$NS\"}}"
airflow db migrate >"$WORK/migrate.log" 2>&1
python -m trainyard pools >"$WORK/pools.json" && airflow pools import "$WORK/pools.json" >/dev/null

echo "== each object as it appears or changes (the run follows)"
for kind in pvc volumesnapshots.snapshot.storage.k8s.io jobs pods services deployments; do
  kubectl -n "$NS" get "$kind" --watch --output-watch-events -o wide 2>/dev/null | sed "s/^/[$kind] /" &
  PIDS+=($!)
done
airflow dags test "trainyard_$PIPELINE" "$DAY" >"$WORK/dags_test.log" 2>&1 \
  || { tail -n 60 "$WORK/dags_test.log"; echo "smoke: the DAG run failed"; exit 1; }
sleep 5 && kill "${PIDS[@]}" 2>/dev/null || true
echo "== the run's summary (the summary pod's output)"
sed -n '/starting task_id=summary/,/end task task_id=summary/p' "$WORK/dags_test.log" | grep -F '[base]'

echo "== training left nothing behind"
LEFT="$(kubectl -n "$NS" get jobs,pods,services -l app.kubernetes.io/component=training -o name)"
[ -z "$LEFT" ] || { echo "smoke: left behind: $LEFT"; exit 1; }
kubectl -n "$NS" get pvc,deployments,services -l app.kubernetes.io/name=trainyard -o wide

echo "== a prediction through the serving Service"
kubectl -n "$NS" port-forward "svc/serving-$MODEL" 18501:8501 >/dev/null &
PIDS+=($!)
sleep 3
curl -fsS "http://127.0.0.1:18501/v1/models/$MODEL" && echo
case "$PIPELINE" in
  digits) BODY="{\"instances\": [{\"image\": $(python -c 'print([[[1.0 if c == 4 else 0.0] for c in range(8)] for _ in range(8)])')}]}" ;;
  *) BODY='{"instances": [{"amount": 950.0, "hour": 3, "customer_age": 19}]}' ;;
esac
curl -fsS -H 'Content-Type: application/json' -d "$BODY" \
  "http://127.0.0.1:18501/v1/models/$MODEL:predict" && echo
echo "smoke: $PIPELINE ran end to end on $(kubectl config current-context)"
