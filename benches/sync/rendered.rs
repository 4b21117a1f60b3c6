//! The rendered repository of the benchmark: Kustomize apps (base +
//! production overlay) and Helm charts, beside the same objects as plain YAML.

use std::path::Path;

/// Kustomize apps: a Deployment, a Service and a generated ConfigMap each.
pub const KUSTOMIZE_APPS: usize = 100;
/// Helm apps: a Deployment, a Service and a ConfigMap each.
pub const HELM_APPS: usize = 20;
const NAMESPACES: usize = 10;

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, content).expect("write");
}

fn deployment(name: &str, ns: &str, image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: 0\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: web\n        image: {image}\n"
    )
}

fn service(name: &str, ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  selector: {{app: {name}}}\n  ports:\n  - port: 80\n    targetPort: 8080\n"
    )
}

fn namespaces(root: &Path, prefix: &str) {
    let yaml: Vec<String> = (0..NAMESPACES)
        .map(|i| format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {prefix}-{i}\n"))
        .collect();
    write(&root.join("00-namespaces/namespaces.yaml"), &yaml.join("---\n"));
}

/// The rendered repository; returns the objects it renders to.
pub fn generate(root: &Path, prefix: &str) -> usize {
    namespaces(root, prefix);
    for app in 0..KUSTOMIZE_APPS {
        let name = format!("k-{app:03}");
        let dir = root.join(&name);
        let ns = format!("{prefix}-{}", app % NAMESPACES);
        write(&dir.join("gitcanary.yaml"), "kustomize:\n  path: overlays/production\n");
        write(
            &dir.join("base/kustomization.yaml"),
            &format!(
                "resources: [deployment.yaml, service.yaml]\nconfigMapGenerator:\n- name: {name}-settings\n  literals: [color=blue]\n"
            ),
        );
        write(
            &dir.join("base/deployment.yaml"),
            &deployment(&name, "base", &format!("registry.test/{name}:0")),
        );
        write(&dir.join("base/service.yaml"), &service(&name, "base"));
        write(
            &dir.join("overlays/production/kustomization.yaml"),
            &format!(
                "namespace: {ns}\nresources: [../../base]\nimages:\n- name: registry.test/{name}\n  newTag: \"1.0\"\n"
            ),
        );
    }
    for app in 0..HELM_APPS {
        let name = format!("h-{app:03}");
        let dir = root.join(&name);
        let ns = format!("{prefix}-{}", app % NAMESPACES);
        write(&dir.join("gitcanary.yaml"), &format!("helm:\n  namespace: {ns}\n"));
        write(
            &dir.join("Chart.yaml"),
            &format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n"),
        );
        write(&dir.join("values.yaml"), "tag: \"1.0\"\ncolor: blue\n");
        write(
            &dir.join("templates/deployment.yaml"),
            &deployment(
                "{{ .Release.Name }}",
                "{{ .Release.Namespace }}",
                &format!("registry.test/{name}:{{{{ .Values.tag }}}}"),
            ),
        );
        write(
            &dir.join("templates/service.yaml"),
            &service("{{ .Release.Name }}", "{{ .Release.Namespace }}"),
        );
        write(
            &dir.join("templates/configmap.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n  namespace: {{ .Release.Namespace }}\ndata:\n  color: {{ .Values.color }}\n",
        );
    }
    NAMESPACES + 3 * (KUSTOMIZE_APPS + HELM_APPS)
}

/// One Helm app's values changed: what the "one app changed" figure pushes.
pub fn change_one_value(root: &Path) {
    write(&root.join("h-000/values.yaml"), "tag: \"1.0\"\ncolor: shade-1\n");
}

/// The same objects as plain YAML, one file per app; returns their number.
pub fn generate_plain(root: &Path, prefix: &str) -> usize {
    namespaces(root, prefix);
    for (app, name) in (0..KUSTOMIZE_APPS)
        .map(|a| (a, format!("k-{a:03}")))
        .chain((0..HELM_APPS).map(|a| (a, format!("h-{a:03}"))))
    {
        let ns = format!("{prefix}-{}", app % NAMESPACES);
        let config_map = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  color: blue\n"
        );
        let yaml = [
            deployment(&name, &ns, &format!("registry.test/{name}:1.0")),
            service(&name, &ns),
            config_map,
        ];
        write(&root.join(&name).join("app.yaml"), &yaml.join("---\n"));
    }
    NAMESPACES + 3 * (KUSTOMIZE_APPS + HELM_APPS)
}

/// One plain app's ConfigMap changed, as `change_one_value` does.
pub fn change_one_plain(root: &Path) {
    let path = root.join("h-000/app.yaml");
    let text = std::fs::read_to_string(&path).expect("read");
    write(&path, &text.replace("color: blue", "color: shade-1"));
}
