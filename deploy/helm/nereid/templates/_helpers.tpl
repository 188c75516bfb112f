{{/* Names, labels and the addresses the components give each other. */}}

{{- define "nereid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>", or "<release>-nereid" when the release name does not contain the chart's. */}}
{{- define "nereid.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "nereid.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nereid.labels" -}}
helm.sh/chart: {{ include "nereid.chart" . }}
{{ include "nereid.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nereid.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nereid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nereid.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "nereid.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nereid.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "nereid.tokenSecret" -}}
{{- default (printf "%s-token" (include "nereid.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* The control plane's StatefulSet and its headless Service share this name. */}}
{{- define "nereid.controlPlane" -}}
{{- printf "%s-control-plane" (include "nereid.fullname" .) }}
{{- end }}

{{/*
gRPC address of control-plane pod N: "<pod>.<headless service>:<port>". The short form resolves
through the pod's DNS search path within the release's namespace, so the rendered manifests do
not depend on the namespace or the cluster domain.
*/}}
{{- define "nereid.controlPlaneAddress" -}}
{{- $cp := include "nereid.controlPlane" .root }}
{{- printf "%s-%d.%s:%d" $cp (int .ordinal) $cp (int .root.Values.controlPlane.grpcPort) }}
{{- end }}

{{/* --peers of the bootstrapping nodes: "1=<pod 0>,2=<pod 1>,..." (node id = ordinal + 1). */}}
{{- define "nereid.controlPlanePeers" -}}
{{- $peers := list }}
{{- range $i := until (int .Values.controlPlane.initialMembers) }}
{{- $peers = append $peers (printf "%d=%s" (add $i 1) (include "nereid.controlPlaneAddress" (dict "root" $ "ordinal" $i))) }}
{{- end }}
{{- join "," $peers }}
{{- end }}

{{/* --control-plane of workers and routers: every control-plane pod, comma-separated. */}}
{{- define "nereid.controlPlaneAddresses" -}}
{{- $addrs := list }}
{{- range $i := until (int .Values.controlPlane.replicas) }}
{{- $addrs = append $addrs (include "nereid.controlPlaneAddress" (dict "root" $ "ordinal" $i)) }}
{{- end }}
{{- join "," $addrs }}
{{- end }}

{{/* prometheus.io/* pod annotations for a pod whose metrics listen on `port`. */}}
{{- define "nereid.prometheusAnnotations" -}}
{{- if .root.Values.prometheus.scrape }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/* The token volume every component mounts at /etc/nereid/token. */}}
{{- define "nereid.tokenVolume" -}}
- name: token
  secret:
    secretName: {{ include "nereid.tokenSecret" . }}
    defaultMode: 0440
{{- end }}

{{/*
Cluster mutual TLS (cluster.tls.secretName): the flags every component gets, as list items, and
the volume mounted at /etc/nereid/cluster-tls (a directory, so a renewed Secret reaches the files
and the certificate reloads without a restart). Include them only when the value is set.
*/}}
{{- define "nereid.clusterTlsArgs" -}}
- --cluster-tls-cert
- /etc/nereid/cluster-tls/tls.crt
- --cluster-tls-key
- /etc/nereid/cluster-tls/tls.key
- --cluster-tls-ca
- /etc/nereid/cluster-tls/ca.crt
{{- end }}

{{- define "nereid.clusterTlsMount" -}}
- name: cluster-tls
  mountPath: /etc/nereid/cluster-tls
  readOnly: true
{{- end }}

{{- define "nereid.clusterTlsVolume" -}}
- name: cluster-tls
  secret:
    secretName: {{ .Values.cluster.tls.secretName | quote }}
    defaultMode: 0440
{{- end }}
