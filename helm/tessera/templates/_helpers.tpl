{{/* The DRA driver name is compiled into the plugin, the CDI kind and every DeviceClass. */}}
{{- define "tessera.driverName" -}}gpu.tessera.dev{{- end }}

{{- define "tessera.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped prefix: "tessera" for a release called tessera, "<release>-tessera" otherwise. */}}
{{- define "tessera.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tessera
{{- end }}

{{/* Selector labels of one component; call with (dict "root" $ "component" "controller"). */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tessera.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "tessera.pluginName" -}}{{ include "tessera.fullname" . }}-kubelet-plugin{{- end }}
{{- define "tessera.controllerName" -}}{{ include "tessera.fullname" . }}-controller{{- end }}
{{- define "tessera.webhookServiceName" -}}{{ include "tessera.fullname" . }}-webhook{{- end }}
{{- define "tessera.webhookSecretName" -}}{{ include "tessera.fullname" . }}-webhook-tls{{- end }}
{{- define "tessera.webhookCertificateName" -}}{{ include "tessera.fullname" . }}-webhook{{- end }}

{{/* The plugin runs privileged with NVML unless told otherwise, and never when simulating. */}}
{{- define "tessera.pluginPrivileged" -}}
{{- if kindIs "bool" .Values.kubeletPlugin.privileged }}
{{- .Values.kubeletPlugin.privileged }}
{{- else }}
{{- include "tessera.pluginNvml" . }}
{{- end }}
{{- end }}

{{/*
"true" when the plugin discovers real GPUs through NVML: no simulated profile, neither for every
node (simulate) nor per node from a label (simulateFromNodeLabel).
*/}}
{{- define "tessera.pluginNvml" -}}
{{- and (empty .Values.kubeletPlugin.simulate) (empty .Values.kubeletPlugin.simulateFromNodeLabel) }}
{{- end }}

{{/*
The webhook's CA and serving certificate as YAML {ca.crt, tls.crt, tls.key} (PEM), for
certificates.mode=helm. An existing Secret is reused, so upgrades keep the certificate instead of
rotating it (and restarting the controller) every time. `helm template` cannot look anything up
and renders a fresh pair each run. The result is memoised in .Values because genCA is random and
the Secret, both webhook configurations and the Deployment's checksum must see the same pair.
*/}}
{{- define "tessera.webhookTLS" -}}
{{- if not (hasKey .Values "_tesseraWebhookTLS") }}
{{- $secretName := include "tessera.webhookSecretName" . }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $secretName }}
{{- $data := dict }}
{{- if and $existing (hasKey $existing "data") }}
{{- $data = $existing.data }}
{{- end }}
{{- $tls := dict }}
{{- if and (hasKey $data "ca.crt") (hasKey $data "tls.crt") (hasKey $data "tls.key") }}
{{- $tls = dict "ca.crt" (index $data "ca.crt" | b64dec) "tls.crt" (index $data "tls.crt" | b64dec) "tls.key" (index $data "tls.key" | b64dec) }}
{{- else }}
{{- $days := int .Values.webhook.certificates.validityDays }}
{{- $svc := include "tessera.webhookServiceName" . }}
{{- $ns := .Release.Namespace }}
{{- $ca := genCA (printf "%s-ca" $svc) $days }}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $dns $days $ca }}
{{- $tls = dict "ca.crt" $ca.Cert "tls.crt" $cert.Cert "tls.key" $cert.Key }}
{{- end }}
{{- $_ := set .Values "_tesseraWebhookTLS" $tls }}
{{- end }}
{{- toYaml (get .Values "_tesseraWebhookTLS") }}
{{- end }}

{{/* clientConfig of one webhook; call with (dict "root" $ "path" "/validate-deviceclass"). */}}
{{- define "tessera.webhookClientConfig" -}}
service:
  name: {{ include "tessera.webhookServiceName" .root }}
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: 443
{{- if eq .root.Values.webhook.certificates.mode "helm" }}
caBundle: {{ index (include "tessera.webhookTLS" .root | fromYaml) "ca.crt" | b64enc }}
{{- end }}
{{- end }}

{{- define "tessera.webhookAnnotations" -}}
{{- if eq .Values.webhook.certificates.mode "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "tessera.webhookCertificateName" .) }}
{{- end }}
{{- end }}
