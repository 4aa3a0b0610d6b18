// Package deploy holds what ships next to the binaries to watch them: the
// Grafana dashboard (grafana/jsbridge.json) and the Prometheus alerting
// rules (prometheus/alerts.yml). It has no Go API; its tests check that
// every metric and label the dashboard and the rules query is one the
// bridge and the consumer export, read from their real registries.
package deploy
