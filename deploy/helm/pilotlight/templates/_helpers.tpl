{{/*
Names, labels and the pieces more than one template needs.
*/}}

{{- define "pilotlight.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's objects are named after it; a release whose name holds the
chart's is used as it is (release "pilotlight": "pilotlight-ring").
*/}}
{{- define "pilotlight.fullname" -}}
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

{{- define "pilotlight.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pilotlight.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pilotlight.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pilotlight.labels" -}}
helm.sh/chart: {{ include "pilotlight.chart" . }}
{{ include "pilotlight.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "pilotlight.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.registry }}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "pilotlight.tokensSecretName" -}}
{{- .Values.tokens.existingSecret | default (printf "%s-tokens" (include "pilotlight.fullname" .)) }}
{{- end }}

{{/*
The container port the dispatch Service, /metrics and the supervisor's
NetworkPolicy rule lead to: the dispatch listener's, or with one
listener the controllers'.
*/}}
{{- define "pilotlight.dispatchTargetPort" -}}
{{- if .Values.dispatchListener.enabled }}dispatch{{ else }}http{{ end }}
{{- end }}

{{- define "pilotlight.dispatchPortNumber" -}}
{{- if .Values.dispatchListener.enabled }}{{ .Values.service.ports.dispatch }}{{ else }}{{ .Values.service.ports.controllers }}{{ end }}
{{- end }}

{{- define "pilotlight.tokenFile" -}}
/var/run/secrets/pilotlight/token_secret
{{- end }}

{{/*
pilotlight.conf: what the chart decides (listeners, the token file),
then .Values.config in name order. Numbers are written whole (YAML gives
Helm floats, which would print as 1e+06); booleans as on or off.
*/}}
{{- define "pilotlight.config" -}}
{{- $owned := list "listen" "dispatch_listen" "ring_dns" "ring_peers" "ring_self" "token_secret" "token_secret_file" -}}
{{- range $k, $v := .Values.config }}
{{- if has $k $owned }}
{{- fail (printf "config.%s is set by the chart (service.ports, dispatchListener, tokens); remove it from config" $k) }}
{{- end }}
{{- end -}}
# Controllers (GET /connect, GET /warm-start), the probes, the ring.
listen = 0.0.0.0:{{ .Values.service.ports.controllers }}
{{- if .Values.dispatchListener.enabled }}
# Dispatches, /metrics, /debug/*: the controllers' port answers them 403.
dispatch_listen = 0.0.0.0:{{ .Values.service.ports.dispatch }}
{{- end }}
{{- if .Values.tokens.enabled }}
# The workload token secret, from the Secret {{ include "pilotlight.tokensSecretName" . }}.
token_secret_file = {{ include "pilotlight.tokenFile" . }}
{{- end }}
{{- range $k, $v := .Values.config }}
{{- if kindIs "bool" $v }}
{{ $k }} = {{ ternary "on" "off" $v }}
{{- else if or (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) }}
{{ $k }} = {{ int64 $v }}
{{- else if or (kindIs "invalid" $v) (eq (toString $v) "") }}
{{ $k }} =
{{- else }}
{{ $k }} = {{ $v }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Refusals that would otherwise deploy something that cannot work.
*/}}
{{- define "pilotlight.validate" -}}
{{- $c := .Values.config -}}
{{- $need := add (div (int64 (default 0 $c.drain_delay_ms)) 1000) (div (int64 (default 10000 $c.shutdown_timeout_ms)) 1000) 5 -}}
{{- if lt (int64 .Values.terminationGracePeriodSeconds) $need }}
{{- fail (printf "terminationGracePeriodSeconds %v is shorter than drain_delay_ms + shutdown_timeout_ms + 5 s (%v s)" .Values.terminationGracePeriodSeconds $need) }}
{{- end }}
{{- if and (not .Values.tokens.enabled) (ne (toString (default "disabled" $c.token_mode)) "disabled") }}
{{- fail "config.token_mode needs tokens.enabled (the secret to verify with)" }}
{{- end }}
{{- if eq (int64 .Values.service.ports.controllers) (int64 .Values.service.ports.dispatch) }}
{{- fail "service.ports.controllers and service.ports.dispatch must differ" }}
{{- end }}
{{- end }}
