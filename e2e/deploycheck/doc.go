// Package deploycheck checks Parley's deployment files offline, without
// Docker or a Kubernetes cluster.
//
// Its tests load ../../docker-compose.yml with the compose-spec loader and
// render ../../deploy/k8s with kustomize, decoding every resource strictly into
// the Kubernetes API types, and then hold both to the rules of STYLE.md §12:
// one replica and the Recreate strategy for the bbolt services, a
// ReadWriteOnce volume each, gRPC probes, non-root read-only containers, and a
// grace period longer than the shutdown timeout. Each check is also run on a
// deliberately broken copy to show that it fails.
package deploycheck
