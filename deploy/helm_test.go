package deploy_test

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/strvals"
)

// chartDir is the chart the tests render and lint.
const chartDir = "kubernetes/jsbridge"

// lintChart runs what `helm lint --strict chartDir` runs (helm's own lint
// package, as the helm command calls it) and fails the test on any
// message of warning severity or above, as --strict does.
func lintChart(t *testing.T) {
	t.Helper()
	linter := lint.All(chartDir, map[string]any{}, "default", false)
	var problems []string
	for _, msg := range linter.Messages {
		if msg.Severity >= support.WarningSev {
			problems = append(problems, msg.Error())
		}
	}
	require.Empty(t, problems, "helm lint --strict %s", chartDir)
}

// templateChart renders the chart as `helm template js chartDir --set s…`
// does without a cluster: helm's own loader, --set parser, values (the
// chart's schema checked), template engine and manifest sorter, with the
// default capabilities. It returns the manifests in install order, as one
// YAML stream.
func templateChart(t *testing.T, set ...string) string {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	require.NoError(t, err)
	vals := map[string]any{}
	for _, s := range set {
		require.NoError(t, strvals.ParseInto(s, vals), "--set %s", s)
	}
	require.NoError(t, chartutil.ProcessDependenciesWithMerge(chrt, vals))
	opts := chartutil.ReleaseOptions{Name: "js", Namespace: "default", Revision: 1, IsInstall: true}
	values, err := chartutil.ToRenderValues(chrt, vals, opts, chartutil.DefaultCapabilities)
	require.NoError(t, err)
	files, err := engine.Render(chrt, values)
	require.NoError(t, err)
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	_, manifests, err := releaseutil.SortManifests(files, chartutil.DefaultCapabilities.APIVersions, releaseutil.InstallOrder)
	require.NoError(t, err)
	var out strings.Builder
	for _, m := range manifests {
		out.WriteString("---\n# Source: " + m.Name + "\n" + m.Content + "\n")
	}
	return out.String()
}

// k8sObject is the part of a rendered object the checks read.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       struct {
		Replicas     *int             `yaml:"replicas"`
		MinAvailable any              `yaml:"minAvailable"`
		Selector     map[string]any   `yaml:"selector"`
		Endpoints    []map[string]any `yaml:"endpoints"`
		Template     struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []struct {
					Name      string `yaml:"name"`
					ConfigMap struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		ValueFrom struct {
			SecretKeyRef struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		SecretRef struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  k8sProbe `yaml:"livenessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// render renders the chart with the --set values (templateChart) and
// returns the objects by "Kind/name".
func render(t *testing.T, set ...string) map[string]k8sObject {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(templateChart(t, set...)))
	out := map[string]k8sObject{}
	for {
		var o k8sObject
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if o.Kind == "" {
			continue
		}
		out[o.Kind+"/"+o.Metadata.Name] = o
	}
	return out
}

// The chart lints, and renders what docs/deploy.md promises: the bridge
// and consumer Deployments with readiness and liveness probes on the ops
// port, their replicas, a PodDisruptionBudget each, the subscriptions
// from a ConfigMap, secrets from a Secret, Prometheus scrape annotations
// or a ServiceMonitor; and every flag and environment variable the
// containers get is one the binaries take (read from their --help).
func TestHelmChart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	t.Parallel()
	lintChart(t)

	objs := render(t)
	for _, want := range []string{
		"Deployment/js-jsbridge-bridge", "Deployment/js-jsbridge-consumer",
		"PodDisruptionBudget/js-jsbridge-bridge", "PodDisruptionBudget/js-jsbridge-consumer",
		"ConfigMap/js-jsbridge-subscriptions", "Secret/js-jsbridge-secrets",
	} {
		require.Contains(t, objs, want)
	}
	secret := objs["Secret/js-jsbridge-secrets"]
	var problems []string
	for _, component := range []string{"bridge", "consumer"} {
		d := objs["Deployment/js-jsbridge-"+component]
		require.Equal(t, 2, *d.Spec.Replicas, component)
		pod := d.Spec.Template
		require.Len(t, pod.Spec.Containers, 1)
		c := pod.Spec.Containers[0]
		require.Equal(t, []string{component}, c.Command)
		require.Equal(t, "run", c.Args[0])
		cli := surface(t, component, "run")
		problems = append(problems, cli.checkArgs("chart "+component, c.Args[1:])...)

		// Probes on the named ops port, which is --ops-addr's port.
		require.Len(t, c.Ports, 1)
		require.Equal(t, "ops", c.Ports[0].Name)
		opsPort := strconv.Itoa(c.Ports[0].ContainerPort)
		require.Contains(t, c.Args, "--ops-addr=0.0.0.0:"+opsPort, component)
		require.Equal(t, k8sProbe{HTTPGet: struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		}{"/readyz", "ops"}}, c.ReadinessProbe, component)
		require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path, component)
		require.Equal(t, "ops", c.LivenessProbe.HTTPGet.Port, component)
		require.Equal(t, "true", pod.Metadata.Annotations["prometheus.io/scrape"], component)
		require.Equal(t, opsPort, pod.Metadata.Annotations["prometheus.io/port"], component)

		for _, e := range c.Env {
			if !cli.envs[e.Name] {
				problems = append(problems, "chart "+component+": env "+e.Name+" is read by no flag")
			}
			if ref := e.ValueFrom.SecretKeyRef; ref.Key != "" {
				require.Equal(t, "js-jsbridge-secrets", ref.Name)
				require.Contains(t, secret.StringData, ref.Key)
			}
		}

		pdb := objs["PodDisruptionBudget/js-jsbridge-"+component]
		require.Equal(t, map[string]any{"matchLabels": toAny(pod.Metadata.Labels)}, pdb.Spec.Selector, component)
	}

	// The consumer reads the subscriptions from the ConfigMap, and each
	// variable a subscription names for its secrets is in the Secret the
	// consumer takes its environment from.
	consumer := objs["Deployment/js-jsbridge-consumer"].Spec.Template.Spec
	require.Equal(t, "js-jsbridge-subscriptions", consumer.Volumes[0].ConfigMap.Name)
	require.Equal(t, "/etc/jsbridge", consumer.Containers[0].VolumeMounts[0].MountPath)
	require.Contains(t, consumer.Containers[0].Args, "--config=/etc/jsbridge/subscriptions.yaml")
	require.Equal(t, "js-jsbridge-secrets", consumer.Containers[0].EnvFrom[0].SecretRef.Name)
	var subs struct {
		Subscriptions []struct {
			SecretsEnv []string          `yaml:"secrets_env"`
			HeadersEnv map[string]string `yaml:"headers_env"`
		} `yaml:"subscriptions"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(objs["ConfigMap/js-jsbridge-subscriptions"].Data["subscriptions.yaml"]), &subs))
	require.NotEmpty(t, subs.Subscriptions)
	for _, s := range subs.Subscriptions {
		for _, env := range s.SecretsEnv {
			require.Contains(t, secret.StringData, env, "secrets_env names a variable the Secret lacks")
		}
		for _, env := range s.HeadersEnv {
			require.Contains(t, secret.StringData, env, "headers_env names a variable the Secret lacks")
		}
	}
	require.Empty(t, problems)

	// With the Prometheus Operator: a ServiceMonitor per component, on
	// the ops port; with an existing Secret, none is created.
	objs = render(t, "metrics.serviceMonitor.enabled=true", "secrets.existingSecret=mine", "metrics.annotations=false")
	for _, component := range []string{"bridge", "consumer"} {
		sm, ok := objs["ServiceMonitor/js-jsbridge-"+component]
		require.True(t, ok, component)
		require.Equal(t, "ops", sm.Spec.Endpoints[0]["port"])
		require.Contains(t, objs, "Service/js-jsbridge-"+component+"-ops")
		require.NotContains(t, objs["Deployment/js-jsbridge-"+component].Spec.Template.Metadata.Annotations, "prometheus.io/scrape")
	}
	require.NotContains(t, objs, "Secret/js-jsbridge-secrets")
	require.Equal(t, "mine", objs["Deployment/js-jsbridge-consumer"].Spec.Template.Spec.Containers[0].EnvFrom[0].SecretRef.Name)
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
