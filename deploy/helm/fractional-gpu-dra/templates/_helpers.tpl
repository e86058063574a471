{{/* Names ------------------------------------------------------------------ */}}

{{- define "fgd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fgd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "fgd.component" (list $ "kubelet-plugin"): <fullname>-<component>, for objects and ServiceAccounts. */}}
{{- define "fgd.component" -}}
{{- $ctx := index . 0 -}}
{{- printf "%s-%s" (include "fgd.fullname" $ctx) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fgd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "fgd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* "fgd.selectorLabels" (list $ "mps-agent") */}}
{{- define "fgd.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ include "fgd.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "fgd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "v%s" .Chart.AppVersion) .Values.image.tag) -}}
{{- end -}}

{{/* Paths: identical inside and outside the containers ------------------------ */}}

{{- define "fgd.registryDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletDir) -}}
{{- end -}}

{{- define "fgd.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) .Values.driverName -}}
{{- end -}}

{{/* Both the plugin (MPS_AGENT_SOCKET) and the agent (SOCKET) get this path. */}}
{{- define "fgd.mpsAgentSocket" -}}
{{- printf "%s/mps-agent.sock" (include "fgd.pluginDir" .) -}}
{{- end -}}

{{/* The controller-managed class's selector: a sentinel that no device can
match (a comparison of two different string constants), so the kube-scheduler
never allocates claims of share.gpu.fractional.dev. The controller recognises
exactly this expression, drops it and evaluates the claim's own selectors. Do
not edit it: the controller compares it character for character. */}}
{{- define "fgd.sentinelExpression" -}}
{{- printf "device.driver == %q && \"share.gpu.fractional.dev/controller-managed\" == \"sentinel\"" .Values.driverName -}}
{{- end -}}

{{/* Node selection: the opt-in label plus the user's extra terms. */}}
{{- define "fgd.nodeSelector" -}}
{{- $sel := merge (dict .Values.nodeSelection.labelKey .Values.nodeSelection.labelValue) (deepCopy .Values.nodeSelection.nodeSelector) -}}
{{- toYaml $sel -}}
{{- end -}}

{{/* The node config file the plugin reads (NODE_CONFIG) when perNode is set;
the init container copies this node's entry (or default.yaml) there. */}}
{{- define "fgd.nodeConfigFile" -}}
/run/fractional-gpu-dra/node-config/node.yaml
{{- end -}}

{{/* Liveness and startup check of the kubelet plugin, run with the container's
environment: ask the registration socket for the plugin's info over gRPC, as
the kubelet does (this goes through the plugin's event loop, so a hung plugin
fails it), check the driver name, then connect to the DRA socket the answer
names. Socket names follow the plugin's own rules (per pod UID). */}}
{{- define "fgd.pluginProbeCommand" -}}
- python
- -c
- |
  import os, socket, sys
  import grpc
  from dra_driver._gen.pluginregistration.v1 import api_pb2, api_pb2_grpc
  from dra_driver.kubeletplugin.sockets import socket_paths
  paths = socket_paths(os.environ["DRIVER_NAME"], os.environ["REGISTRY_DIR"],
                       os.environ["PLUGIN_DIR"], os.environ.get("ROLLING_UPDATE_UID") or None)
  with grpc.insecure_channel("unix://" + paths.registration) as channel:
      info = api_pb2_grpc.RegistrationStub(channel).GetInfo(api_pb2.InfoRequest(), timeout=5)
  if info.name != os.environ["DRIVER_NAME"]:
      sys.exit(f"{paths.registration} serves driver {info.name!r}")
  with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dra:
      dra.settimeout(5)
      dra.connect(info.endpoint)
{{- end -}}

{{/* Security context of the node components: root for the hostPath writes;
privileged only with the nvml backend (GPU device nodes, NVML MIG management,
nvidia-smi compute modes). */}}
{{- define "fgd.nodeSecurityContext" -}}
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
{{- if eq .Values.backend "nvml" }}
privileged: true
{{- else }}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end -}}

{{/* The host's /sys/fs/cgroup inside the kubelet plugin (CGROUP_ROOT). Not the
same path on purpose: the pod's own /sys/fs/cgroup is its cgroup namespace,
which lacks the root's dmem.capacity. */}}
{{- define "fgd.hostCgroupRoot" -}}
/host/sys/fs/cgroup
{{- end -}}

{{/* Whether the kubelet plugin gets the dmem hook's mounts: only the nvml
backend can have dmem regions (fake GPUs have none), and off needs none. */}}
{{- define "fgd.dmemMounted" -}}
{{- if and (eq .Values.backend "nvml") (ne .Values.kubeletPlugin.dmemLimits "off") -}}true{{- end -}}
{{- end -}}

{{/* Observability --------------------------------------------------------------- */}}

{{/* "fgd.observabilityEnv" (list $ <metricsPort>): LOG_FORMAT and, with
metrics.enabled, METRICS_PORT (flags of all three components). */}}
{{- define "fgd.observabilityEnv" -}}
{{- $ctx := index . 0 -}}
- name: LOG_FORMAT
  value: {{ $ctx.Values.logFormat | quote }}
{{- if $ctx.Values.metrics.enabled }}
- name: METRICS_PORT
  value: {{ index . 1 | quote }}
{{- end }}
{{- end -}}

{{/* "fgd.metricsContainerPort" (list $ <metricsPort>): the pod port "metrics"
(on the pod IP; the pods are not hostNetwork and get no hostPort). */}}
{{- define "fgd.metricsContainerPort" -}}
{{- $ctx := index . 0 -}}
{{- if $ctx.Values.metrics.enabled }}
ports:
  - name: metrics
    containerPort: {{ index . 1 }}
    protocol: TCP
{{- end }}
{{- end -}}

{{/* "fgd.metricsService" (list $ "kubelet-plugin" <metricsPort>): the Service
in front of one component's metrics port. Headless (clusterIP: None): Prometheus
scrapes every pod through the Service's endpoints, and a virtual IP would hand
each request to any one of the pods (another node's plugin or agent, another
controller replica), whose numbers are not the ones asked for; so none is
allocated. */}}
{{- define "fgd.metricsService" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ printf "%s-metrics" (include "fgd.component" (list $ctx $component)) | trunc 63 | trimSuffix "-" }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "fgd.labels" $ctx | nindent 4 }}
    app.kubernetes.io/component: {{ $component }}
spec:
  clusterIP: None
  selector:
    {{- include "fgd.selectorLabels" (list $ctx $component) | nindent 4 }}
  ports:
    - name: metrics
      port: {{ index . 2 }}
      targetPort: metrics
      protocol: TCP
{{- end -}}

{{/* "fgd.serviceMonitor" (list $ "kubelet-plugin"): the Prometheus Operator's
ServiceMonitor for that component's metrics Service (same selector labels, port
"metrics"). The DaemonSets' samples get a node label (the pod's node): the
metrics themselves do not name the node. */}}
{{- define "fgd.serviceMonitor" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "fgd.component" (list $ctx $component) }}
  namespace: {{ $ctx.Release.Namespace }}
  {{- /* The chart's labels win over extra labels of the same key. */}}
  {{- $labels := merge (dict "app.kubernetes.io/component" $component) (include "fgd.labels" $ctx | fromYaml) (deepCopy $ctx.Values.metrics.serviceMonitor.labels) }}
  labels:
    {{- toYaml $labels | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "fgd.selectorLabels" (list $ctx $component) | nindent 6 }}
  namespaceSelector:
    matchNames:
      - {{ $ctx.Release.Namespace }}
  endpoints:
    - port: metrics
      path: /metrics
      interval: {{ $ctx.Values.metrics.serviceMonitor.interval }}
      {{- if ne $component "controller" }}
      relabelings:
        - sourceLabels: [__meta_kubernetes_pod_node_name]
          targetLabel: node
          action: replace
      {{- end }}
{{- end -}}

{{/* DRA extended resources (KEP-5004) -------------------------------------------- */}}

{{/* "fgd.migResourceName" (list $ "1g.10gb"): the extended resource name of a MIG profile. */}}
{{- define "fgd.migResourceName" -}}
{{- $ctx := index . 0 -}}
{{- $profile := index . 1 -}}
{{- $mig := $ctx.Values.extendedResources.mig -}}
{{- default (printf "%s%s" $mig.namePrefix $profile) (get $mig.names $profile) -}}
{{- end -}}

{{/* Every extended resource name the chart's classes serve, comma-separated
(EXTENDED_RESOURCE_NAMES, NOTES); empty when extendedResources.enabled=false. */}}
{{- define "fgd.extendedResourceNames" -}}
{{- $names := list -}}
{{- if .Values.extendedResources.enabled -}}
{{- if .Values.extendedResources.gpu.name -}}
{{- $names = append $names .Values.extendedResources.gpu.name -}}
{{- end -}}
{{- range .Values.extendedResources.mig.profiles -}}
{{- $names = append $names (include "fgd.migResourceName" (list $ .)) -}}
{{- end -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/*
The allocator the node default resolves to: "auto" is the controller when it runs.
*/}}
{{- define "fgd.allocator" -}}
{{- $allocator := .Values.nodeSettings.defaults.allocator -}}
{{- if eq $allocator "auto" -}}
{{- ternary "controller" "scheduler" (.Values.controller.enabled | default false) -}}
{{- else -}}
{{- $allocator -}}
{{- end -}}
{{- end }}

{{/* Claims whose MPS shares could land on two daemons (the *-mps-shares-one-daemon policy) --- */}}

{{/* The classes whose requests with capacity.requests are MPS shares of a whole GPU,
as a CEL list: gpu.fractional.dev and, with extendedResources, the whole-GPU class
(its selector picks the same devices). */}}
{{- define "fgd.gpuShareClasses" -}}
{{- $classes := list "gpu.fractional.dev" -}}
{{- if and .Values.extendedResources.enabled .Values.extendedResources.gpu.name -}}
{{- $classes = append $classes .Values.extendedResources.gpu.className -}}
{{- end -}}
{{- toJson $classes -}}
{{- end -}}

{{/* The classes whose requests with capacity.requests are MPS shares of a MIG
instance, as a CEL list: mig.gpu.fractional.dev and the per-profile classes. */}}
{{- define "fgd.migShareClasses" -}}
{{- $classes := list "mig.gpu.fractional.dev" -}}
{{- if .Values.extendedResources.enabled -}}
{{- range .Values.extendedResources.mig.profiles -}}
{{- $classes = append $classes (printf "mig-%s.gpu.fractional.dev" .) -}}
{{- end -}}
{{- end -}}
{{- toJson $classes -}}
{{- end -}}

{{/* "fgd.celAsksCapacity" "r.exactly": CEL, true when that exact request or
sub-request names a capacity amount (a share on the native path). */}}
{{- define "fgd.celAsksCapacity" -}}
{{- printf "has(%s.capacity) && has(%s.capacity.requests) && size(%s.capacity.requests) > 0" . . . -}}
{{- end -}}

{{/* "fgd.celGpuShare" (list $ "r.exactly"): CEL, true when that exact request or
sub-request is an MPS share of a whole GPU: of the controller's class (always a
share: its amount may be in a GpuShare config), or of a GPU class with
capacity.requests. */}}
{{- define "fgd.celGpuShare" -}}
{{- $e := index . 1 -}}
{{- printf "(%s.deviceClassName == 'share.gpu.fractional.dev' || (%s.deviceClassName in %s && %s))" $e $e (include "fgd.gpuShareClasses" (index . 0)) (include "fgd.celAsksCapacity" $e) -}}
{{- end -}}

{{/* "fgd.celMigShare" (list $ "r.exactly"): CEL, true when that exact request or
sub-request is an MPS share of a MIG instance (a MIG class with capacity.requests). */}}
{{- define "fgd.celMigShare" -}}
{{- $e := index . 1 -}}
{{- printf "(%s.deviceClassName in %s && %s)" $e (include "fgd.migShareClasses" (index . 0)) (include "fgd.celAsksCapacity" $e) -}}
{{- end -}}

{{/* "fgd.celMany" "r.exactly": CEL, true when that exact request or sub-request may
get more than one device (count above 1, or allocationMode All). */}}
{{- define "fgd.celMany" -}}
{{- printf "((has(%s.allocationMode) && %s.allocationMode == 'All') || (has(%s.count) && %s.count > 1))" . . . . -}}
{{- end -}}
