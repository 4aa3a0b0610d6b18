// Package deploy holds what ships next to the binaries to run and watch
// them: the Docker Compose stack (compose.yaml), the Helm chart
// (kubernetes/jsbridge), the Grafana dashboard (grafana/jsbridge.json) and
// the Prometheus alerting rules (prometheus/alerts.yml). It has no Go API.
//
// Its tests check each against the code: every metric and label the
// dashboard and the rules query is one the bridge and the consumer
// export, read from their real registries; every flag and environment
// variable compose.yaml and the rendered chart pass is one the binaries'
// --help lists; the chart lints and renders with helm; the container image
// `make image` writes has the promised files and user and delivers a
// webhook when runc runs it; `make release-snapshot`'s goreleaser run gives
// the four archives and their checksums.
package deploy
