//! The Kubernetes examples of README.md, as written there: every ```yaml block is read (all its
//! documents) and checked, then run from the test image.
//!
//! The checks: the restricted Pod Security Standard as far as a manifest shows it, resources on
//! every container, every Secret, ConfigMap and PersistentVolumeClaim a pod refers to defined in
//! the same block, HTTP probes only on routes podhost serves without a credential, and the
//! block valid against Kubernetes' own schemas (`kubernetes-validate --strict`, which .ci/run
//! installs; without it, outside CI, that part says it is skipped).
//!
//! The run: the pod's container is started the way the kubelet starts it, from the block alone
//! ([`launch`]): `command` replaces the image's entrypoint (`podhost pod`) and `args` follow it,
//! the user, the groups (`fsGroup` added), the security context (read-only root, capabilities,
//! no privilege gain, podman's default seccomp profile for `RuntimeDefault`), the environment
//! with the values of the block's Secrets, its volumes (an emptyDir or a claim as a directory
//! of root and the `fsGroup`, setgid, as the kubelet leaves it; Secrets and ConfigMaps as
//! read-only files with their `defaultMode`), and the memory limit. Then its probes run in the
//! container (`curl` for `httpGet`, the command for `exec`) once podhost says it is up, and each
//! must pass with the container still running. What the test replaces is the peers only: core's
//! addresses, the database's URL and CA, each a fake or a throwaway cluster on the host's
//! loopback, which the container reaches as 10.0.2.2 (slirp4netns with `allow_host_loopback`,
//! so that the examples' fixed ports stay inside the container's own network).
//!
//! The scale-out example's replicas all run, on one claim's directory and one database; the
//! one-replica example runs once more under podman's profile with Docker's rules for namespaces
//! (a Kubernetes `RuntimeDefault` on containerd), where podhost must fall back to Landlock.
//!
//! podman's own `kube play` is not what runs them: podman 4.3 (Debian bookworm's, which .ci/run
//! installs) panics on the examples' Secret volumes (a nil pointer in `VolumeFromSecret`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, FakeCore};
use crate::fixture::{CALL_WITHIN, Container, Image, image, repo};
use crate::pg::{self, TestPg};
use crate::podman::find_program;
use crate::tls_front::PrivateCa;

mod launch;

/// The headings of the README sections that hold a Kubernetes example, in order.
const SCALE_OUT: &str = "Scale-out: several replicas on one PostgreSQL store";
const ONE_REPLICA: &str = "Running `serve` on Kubernetes, for example";
const POD: &str = "A Kubernetes pod, for example";

/// The host's loopback as a container on slirp4netns with `allow_host_loopback` reaches it.
const HOST_LOOPBACK: &str = "10.0.2.2";
/// What the downward API gives as `metadata.uid` in these runs.
const POD_UID: &str = "4f1c2e0a-7b5d-4c8e-9a61-2d3f0b8e6c17";
/// How long podhost may take to say it is up in a container.
const STARTS_WITHIN: Duration = Duration::from_secs(60);

/// A ```yaml block of the README: the heading it sits under, its text and its documents.
#[derive(Debug)]
struct Example {
    heading: String,
    text: String,
    docs: Vec<Value>,
}

/// Every ```yaml block of README.md, in order.
fn examples() -> Vec<Example> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut heading = String::new();
    let mut out = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let text: String = lines
                .by_ref()
                .take_while(|l| *l != "```")
                .map(|l| format!("{l}\n"))
                .collect();
            if lang == "yaml" {
                let docs = serde_yaml_ng::Deserializer::from_str(&text)
                    .map(|doc| Value::deserialize(doc).unwrap())
                    .filter(|doc| !doc.is_null())
                    .collect();
                out.push(Example {
                    heading: heading.clone(),
                    text,
                    docs,
                });
            }
        } else if line.starts_with('#') {
            heading = line.trim_start_matches('#').trim().to_owned();
        }
    }
    out
}

/// The example under `heading`.
fn example(heading: &str) -> Example {
    examples()
        .into_iter()
        .find(|e| e.heading == heading)
        .unwrap_or_else(|| panic!("README.md has no ```yaml block under {heading:?}"))
}

/// The document of `kind` named `name`.
fn object<'a>(ex: &'a Example, kind: &str, name: &str) -> Option<&'a Value> {
    ex.docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

/// Each pod the block makes: its name and its spec (a Pod's, or a workload's template's).
fn pod_specs(ex: &Example) -> Vec<(String, &Value)> {
    ex.docs
        .iter()
        .filter_map(|d| {
            let spec = match d["kind"].as_str()? {
                "Pod" => &d["spec"],
                "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" => {
                    &d["spec"]["template"]["spec"]
                }
                "Job" => &d["spec"]["template"]["spec"],
                _ => return None,
            };
            Some((d["metadata"]["name"].as_str()?.to_owned(), spec))
        })
        .collect()
}

/// A pod's containers, init containers included.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers"]
        .into_iter()
        .filter_map(|k| spec[k].as_array())
        .flatten()
}

/// A list field as strings (absent: empty).
fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn the_readme_holds_the_three_kubernetes_examples() {
    let found: Vec<(String, Vec<String>)> = examples()
        .iter()
        .map(|e| {
            let kinds = e
                .docs
                .iter()
                .map(|d| d["kind"].as_str().unwrap().to_owned());
            (e.heading.clone(), kinds.collect())
        })
        .collect();
    let kinds = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        found,
        vec![
            (
                SCALE_OUT.to_owned(),
                kinds(&[
                    "Secret",
                    "ConfigMap",
                    "PersistentVolumeClaim",
                    "PersistentVolumeClaim",
                    "Deployment",
                    "Service"
                ])
            ),
            (
                ONE_REPLICA.to_owned(),
                kinds(&["Secret", "PersistentVolumeClaim", "Deployment", "Service"])
            ),
            (
                POD.to_owned(),
                kinds(&["Pod", "PersistentVolumeClaim", "Secret"])
            ),
        ],
        "a new example needs its test here"
    );
}

/// What the restricted Pod Security Standard refuses in pod `name`, as far as the manifest
/// shows it (the standard's checks that read the pod spec alone).
fn restricted_violations(name: &str, spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[key] == true {
            out.push(format!("{name}: {key}"));
        }
    }
    const VOLUMES: [&str; 8] = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let obj = v.as_object().unwrap();
        for key in obj.keys().filter(|k| *k != "name") {
            if !VOLUMES.contains(&key.as_str()) {
                out.push(format!("{name}: volume {} is a {key}", v["name"]));
            }
        }
    }
    let pod = &spec["securityContext"];
    for c in containers(spec) {
        out.extend(
            container_violations(pod, c)
                .into_iter()
                .map(|v| format!("{name}/{}: {v}", c["name"].as_str().unwrap_or("?"))),
        );
    }
    out
}

/// The restricted standard's container checks, given the pod's security context.
fn container_violations(pod: &Value, c: &Value) -> Vec<String> {
    let own = &c["securityContext"];
    // The container's setting where it has one, else the pod's.
    let either = |key: &str| match &own[key] {
        Value::Null => &pod[key],
        v => v,
    };
    let mut out = Vec::new();
    if own["privileged"] == true {
        out.push("privileged".to_owned());
    }
    if own["allowPrivilegeEscalation"] != false {
        out.push("allowPrivilegeEscalation is not false".to_owned());
    }
    let caps = &own["capabilities"];
    if !strings(&caps["drop"]).contains(&"ALL") {
        out.push("capabilities do not drop ALL".to_owned());
    }
    if strings(&caps["add"])
        .iter()
        .any(|c| *c != "NET_BIND_SERVICE")
    {
        out.push(format!("capabilities added: {}", caps["add"]));
    }
    if either("runAsNonRoot") != true {
        out.push("runAsNonRoot is not true".to_owned());
    }
    if either("runAsUser") == 0 {
        out.push("runAsUser 0".to_owned());
    }
    let seccomp = either("seccompProfile")["type"].as_str();
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        out.push(format!("seccompProfile type {seccomp:?}"));
    }
    for p in c["ports"].as_array().into_iter().flatten() {
        if !p["hostPort"].is_null() {
            out.push(format!("hostPort {}", p["hostPort"]));
        }
    }
    if c["resources"]["requests"]["cpu"].is_null()
        || c["resources"]["requests"]["memory"].is_null()
        || c["resources"]["limits"]["memory"].is_null()
    {
        out.push("resources lack a cpu and memory request or a memory limit".to_owned());
    }
    out
}

#[test]
fn every_example_meets_the_restricted_pod_security_standard_and_has_resources() {
    let violations: Vec<String> = examples()
        .iter()
        .flat_map(|ex| {
            pod_specs(ex)
                .into_iter()
                .flat_map(|(name, spec)| restricted_violations(&name, spec))
                .map(|v| format!("{}: {v}", ex.heading))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(violations, Vec::<String>::new());
}

/// The objects pods of the block refer to that the block does not define, and workloads whose
/// selector does not select their own pods.
fn missing_references(ex: &Example) -> Vec<String> {
    let mut out = Vec::new();
    let mut need = |kind: &str, name: &Value, key: Option<&Value>| {
        let name = name.as_str().unwrap_or_default();
        match (object(ex, kind, name), key.and_then(Value::as_str)) {
            (None, _) => out.push(format!("{kind} {name} is not defined")),
            (Some(obj), Some(key)) if data_of(obj, key).is_none() => {
                out.push(format!("{kind} {name} has no key {key}"));
            }
            _ => {}
        }
    };
    for (_, spec) in pod_specs(ex) {
        for v in spec["volumes"].as_array().into_iter().flatten() {
            if v["persistentVolumeClaim"].is_object() {
                need(
                    "PersistentVolumeClaim",
                    &v["persistentVolumeClaim"]["claimName"],
                    None,
                );
            }
            if v["secret"].is_object() {
                need("Secret", &v["secret"]["secretName"], None);
            }
            if v["configMap"].is_object() {
                need("ConfigMap", &v["configMap"]["name"], None);
            }
        }
        for c in containers(spec) {
            for e in c["env"].as_array().into_iter().flatten() {
                for (field, kind) in [("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")]
                {
                    let r = &e["valueFrom"][field];
                    if r.is_object() {
                        need(kind, &r["name"], Some(&r["key"]));
                    }
                }
            }
        }
    }
    for d in &ex.docs {
        let labels = &d["spec"]["template"]["metadata"]["labels"];
        if let Some(selector) = d["spec"]["selector"]["matchLabels"].as_object()
            && selector.iter().any(|(k, v)| &labels[k] != v)
        {
            out.push(format!(
                "{} whose selector misses its pods",
                d["metadata"]["name"]
            ));
        }
    }
    out.extend(service_misses(ex));
    out
}

/// Services of the block that select no pod of it, or send to a port no container of the
/// selected pods has.
fn service_misses(ex: &Example) -> Vec<String> {
    let mut out = Vec::new();
    for svc in ex.docs.iter().filter(|d| d["kind"] == "Service") {
        let name = &svc["metadata"]["name"];
        let selector = svc["spec"]["selector"].as_object();
        let selected: Vec<&Value> = ex
            .docs
            .iter()
            .filter(|d| {
                let labels = &d["spec"]["template"]["metadata"]["labels"];
                selector.is_some_and(|s| s.iter().all(|(k, v)| &labels[k] == v))
            })
            .collect();
        if selected.is_empty() {
            out.push(format!("Service {name} selects no pod of the block"));
        }
        for port in svc["spec"]["ports"].as_array().into_iter().flatten() {
            let target = &port["targetPort"];
            // A port's name, or its number.
            let found = selected.iter().any(|d| {
                containers(&d["spec"]["template"]["spec"]).any(|c| {
                    let mut ports = c["ports"].as_array().into_iter().flatten();
                    ports.any(|p| p["name"] == *target || p["containerPort"] == *target)
                })
            });
            if !found {
                out.push(format!(
                    "Service {name} targets port {target}, which no container has"
                ));
            }
        }
    }
    out
}

/// A Secret's or ConfigMap's value for `key` (`stringData`, or a ConfigMap's `data`).
fn data_of<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    assert!(
        obj["kind"] != "Secret" || obj["data"].is_null(),
        "Secret {}: `data` (base64) is not read by this test, use `stringData`",
        obj["metadata"]["name"]
    );
    ["stringData", "data"]
        .iter()
        .find_map(|field| obj[field][key].as_str())
}

#[test]
fn every_object_an_example_refers_to_is_defined_in_it() {
    let missing: Vec<String> = examples()
        .iter()
        .flat_map(|ex| {
            missing_references(ex)
                .into_iter()
                .map(|m| format!("{}: {m}", ex.heading))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(missing, Vec::<String>::new());
}

/// The routes podhost serves without a credential (`security: []` in openapi.yaml): the only
/// ones a kubelet's `httpGet` probe can use.
fn open_routes() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("openapi.yaml")).unwrap();
    let spec: Value = serde_yaml_ng::from_str(&text).unwrap();
    spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, ops)| ops["get"]["security"] == json!([]))
        .map(|(path, _)| path.clone())
        .collect()
}

/// The container port a probe's `port` names (a number, or a name of the container's ports).
fn probe_port(c: &Value, port: &Value) -> Option<u64> {
    port.as_u64().or_else(|| {
        c["ports"].as_array()?.iter().find(|p| p["name"] == *port)?["containerPort"].as_u64()
    })
}

/// The probes of a container, by kind.
fn probes(c: &Value) -> impl Iterator<Item = (&'static str, &Value)> {
    ["startupProbe", "readinessProbe", "livenessProbe"]
        .into_iter()
        .filter(|&k| c[k].is_object())
        .map(|k| (k, &c[k]))
}

#[test]
fn http_probes_ask_routes_podhost_serves_without_a_credential() {
    let open = open_routes();
    assert_eq!(
        open,
        BTreeSet::from(["/livez", "/readyz", "/metrics"].map(String::from)),
        "openapi.yaml's routes without a credential"
    );
    let mut bad = Vec::new();
    let mut seen = 0;
    for ex in examples() {
        for (_, spec) in pod_specs(&ex) {
            for c in containers(spec) {
                for (kind, p) in probes(c) {
                    let Some(get) = p["httpGet"].as_object() else {
                        continue;
                    };
                    seen += 1;
                    let path = get["path"].as_str().unwrap_or_default();
                    if !open.contains(path) || path == "/metrics" {
                        bad.push(format!("{}: {kind} on {path}", ex.heading));
                    }
                    if probe_port(c, &get["port"]).is_none() {
                        bad.push(format!("{}: {kind} on port {}", ex.heading, get["port"]));
                    }
                }
            }
        }
    }
    assert_eq!(bad, Vec::<String>::new());
    assert_eq!(seen, 4, "the serve examples' readiness and liveness probes");
}

#[test]
fn every_example_is_valid_against_the_kubernetes_schemas() {
    let Some(program) = find_program("kubernetes-validate") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "kubernetes-validate is not installed: .ci/run installs it (pip)"
        );
        eprintln!("kubernetes-validate is not installed: skipping the schema check");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut failed = Vec::new();
    for (n, ex) in examples().iter().enumerate() {
        let file = dir.path().join(format!("example-{n}.yaml"));
        std::fs::write(&file, &ex.text).unwrap();
        let out = std::process::Command::new(&program)
            .args(["--strict", "--quiet"])
            .arg(&file)
            .output()
            .unwrap();
        if !out.status.success() {
            failed.push(format!(
                "{}:\n{}{}",
                ex.heading,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The pod spec inside document `d`, to change.
fn pod_spec_mut(d: &mut Value) -> Option<&mut Value> {
    match d["kind"].as_str()? {
        "Pod" => Some(&mut d["spec"]),
        _ if d["spec"]["template"]["spec"].is_object() => Some(&mut d["spec"]["template"]["spec"]),
        _ => None,
    }
}

/// Gives env variable `name` of every container of the block `value`: a peer's address
/// replaced by the test's.
fn set_env(ex: &mut Example, name: &str, value: &str) {
    let mut set = 0;
    for spec in ex.docs.iter_mut().filter_map(pod_spec_mut) {
        for c in spec["containers"].as_array_mut().into_iter().flatten() {
            for e in c["env"].as_array_mut().into_iter().flatten() {
                if e["name"] == name {
                    *e = json!({"name": name, "value": value});
                    set += 1;
                }
            }
        }
    }
    assert!(set > 0, "{}: no env {name}", ex.heading);
}

/// Gives key `key` of the block's `kind` `name` (a Secret or a ConfigMap) `value`.
fn set_data(ex: &mut Example, kind: &str, name: &str, key: &str, value: &str) {
    let obj = ex
        .docs
        .iter_mut()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{}: no {kind} {name}", ex.heading));
    let field = if obj["data"][key].is_string() {
        "data"
    } else {
        "stringData"
    };
    assert!(
        obj[field][key].is_string(),
        "{kind} {name} has no key {key}"
    );
    obj[field][key] = json!(value);
}

/// Runs probe `p` of container `c` in the running container; what it got when it fails.
async fn probe(container: &Container, c: &Value, p: &Value) -> Result<(), String> {
    if let Some(get) = p["httpGet"].as_object() {
        let port = probe_port(c, &get["port"]).unwrap();
        let url = format!("http://127.0.0.1:{port}{}", get["path"].as_str().unwrap());
        let out = container
            .exec(&[
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
                &url,
            ])
            .await;
        let code = String::from_utf8_lossy(&out.stdout).into_owned();
        return match code.parse::<u16>() {
            Ok(200..400) => Ok(()),
            _ => Err(format!(
                "{url} answered {code:?} {}",
                String::from_utf8_lossy(&out.stderr)
            )),
        };
    }
    let argv = strings(&p["exec"]["command"]);
    assert!(!argv.is_empty(), "a probe neither httpGet nor exec: {p}");
    let out = container.exec(&argv).await;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{argv:?} exited {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// Every probe of container `c` passes in the running container, which is still running after
/// them; prints the confinement podhost logged.
async fn assert_up_and_ready(image: &Image, container: &Container, c: &Value) {
    for (kind, p) in probes(c) {
        if let Err(got) = probe(container, c, p).await {
            panic!(
                "{kind} failed: {got}; the container's output:\n{}",
                container.logs().await
            );
        }
    }
    let state = image
        .podman
        .ok(
            ["inspect", "--format", "{{.State.Status}}", &container.name],
            CALL_WITHIN,
        )
        .await;
    assert_eq!(state.trim(), "running", "{}", container.logs().await);
    // What the container got, and what podhost warned about, for the test's output.
    let logs = container.logs().await;
    for line in logs
        .lines()
        .filter(|l| l.contains("are confined") || l.contains(r#""level":"WARN""#))
    {
        println!("{}: {line}", container.name);
    }
}

/// Stops the container as the kubelet stops a pod (SIGTERM, SIGKILL after the pod's
/// `terminationGracePeriodSeconds`, 30 by default); podhost must have ended on its own, with 0.
async fn assert_stops_within_grace(image: &Image, container: &Container, spec: &Value) {
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    image
        .podman
        .ok(
            ["stop", "--time", &grace.to_string(), &container.name],
            CALL_WITHIN,
        )
        .await;
    let code = image
        .podman
        .ok(
            [
                "inspect",
                "--format",
                "{{.State.ExitCode}}",
                &container.name,
            ],
            CALL_WITHIN,
        )
        .await;
    assert_eq!(
        code.trim(),
        "0",
        "after SIGTERM, with a grace of {grace} s; the output:\n{}",
        container.logs().await
    );
}

/// Starts `replicas` containers of the block's one workload, sharing its claims, with `extra`
/// flags after the example's; waits for each to log `up`, then asserts each is up and ready.
/// The containers' output.
async fn run_example(
    image: &'static Image,
    ex: &Example,
    replicas: u64,
    extra: &[String],
    up: &str,
) -> Vec<String> {
    let (name, spec) = pod_specs(ex).into_iter().next().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mut launch = launch::launch(ex, &name, spec, root.path());
    launch.flags.extend(extra.iter().cloned());
    let mut started = Vec::new();
    for _ in 0..replicas {
        let container = image.start_bare(&launch.flags, &launch.args).await;
        container.wait_log(up, STARTS_WITHIN).await;
        started.push(container);
    }
    let mut logs = Vec::new();
    for container in &started {
        assert_up_and_ready(image, container, &spec["containers"][0]).await;
    }
    for container in &started {
        assert_stops_within_grace(image, container, spec).await;
        logs.push(container.logs().await);
    }
    logs
}

/// podman's default seccomp profile made as strict as Docker's (and containerd's, a
/// Kubernetes `RuntimeDefault`) for a container without `CAP_SYS_ADMIN`: no `unshare` or
/// `setns` (EPERM), `clone3` ENOSYS, `clone` only without a namespace flag. Its path, in `dir`.
fn docker_like_seccomp(dir: &Path) -> PathBuf {
    const PODMAN: &str = "/usr/share/containers/seccomp.json";
    let text = std::fs::read_to_string(PODMAN)
        .unwrap_or_else(|e| panic!("{PODMAN} (podman's default profile): {e}"));
    let mut profile: Value = serde_json::from_str(&text).unwrap();
    const NAMESPACED: [&str; 4] = ["clone", "clone3", "unshare", "setns"];
    let syscalls = profile["syscalls"].as_array_mut().unwrap();
    for rule in syscalls.iter_mut() {
        if rule["action"] == "SCMP_ACT_ALLOW" && rule["args"].as_array().is_none_or(Vec::is_empty) {
            let names = rule["names"].as_array_mut().unwrap();
            names.retain(|n| !NAMESPACED.contains(&n.as_str().unwrap()));
        }
    }
    // Docker's rule: CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC |
    // CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET masked out.
    syscalls.push(json!({"names": ["clone"], "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 0, "value": 0x7E02_0000_u64, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]}));
    syscalls
        .push(json!({"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}));
    syscalls.push(json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}));
    let path = dir.join("docker-like-seccomp.json");
    std::fs::write(&path, profile.to_string()).unwrap();
    path
}

#[tokio::test]
async fn the_one_replica_serve_example_runs_and_is_ready() {
    let Some(image) = image().await else { return };
    let ex = example(ONE_REPLICA);
    let replicas = ex.docs.iter().find_map(|d| d["spec"]["replicas"].as_u64());
    assert_eq!(replicas, Some(1));
    run_example(image, &ex, 1, &[], "podhost serve listening").await;
}

#[tokio::test]
async fn the_serve_example_falls_back_to_landlock_where_namespaces_are_refused() {
    let Some(image) = image().await else { return };
    let ex = example(ONE_REPLICA);
    let dir = tempfile::tempdir().unwrap();
    let profile = docker_like_seccomp(dir.path());
    let extra = [format!("--security-opt=seccomp={}", profile.display())];
    let logs = run_example(image, &ex, 1, &extra, "podhost serve listening").await;
    let level = confinement(&logs[0]);
    assert!(level.contains("namespaces none, network host"), "{level}");
    println!("{level}");
}

#[tokio::test]
async fn the_scale_out_example_runs_its_replicas_on_postgresql() {
    let Some(image) = image().await else { return };
    if !pg::installed() {
        pg::say_skipped();
        return;
    }
    // The database over verified TLS, its CA from the ConfigMap, as the example has it.
    let ca = PrivateCa::for_names(&[HOST_LOOPBACK]);
    let cluster = TestPg::start_tls(&ca.cert_pem, &ca.key_pem).unwrap();
    let url = cluster.fresh_db().replace("127.0.0.1", HOST_LOOPBACK) + "?sslmode=require";
    let mut ex = example(SCALE_OUT);
    set_data(&mut ex, "Secret", "podhost-serve", "store", &url);
    set_data(&mut ex, "ConfigMap", "podhost-db-ca", "ca.pem", &ca.ca_pem);
    let replicas = ex.docs.iter().find_map(|d| d["spec"]["replicas"].as_u64());
    assert_eq!(replicas, Some(3));
    run_example(image, &ex, 3, &[], "podhost serve listening").await;
}

/// Runs the pod example against a fake core, with `extra` flags after the example's, until it
/// is connected and ready, then stops it; its output.
async fn run_pod_example(image: &'static Image, extra: &[String]) -> String {
    let mut ex = example(POD);
    let secret = object(&ex, "Secret", "sbx-0123-join").expect("the join token's Secret");
    let join_token = data_of(secret, "join-token").unwrap().to_owned();
    let (_, spec) = pod_specs(&ex).into_iter().next().unwrap();
    let env = &spec["containers"][0]["env"];
    let sandbox = env
        .as_array()
        .and_then(|e| e.iter().find(|e| e["name"] == "NYLORUN_SANDBOX_ID"))
        .map(|e| e["value"].as_str().unwrap().to_owned())
        .expect("NYLORUN_SANDBOX_ID");
    let core = FakeCore::start(CoreOptions {
        sandbox_id: sandbox,
        pod_uid: POD_UID.to_owned(),
        join_token,
        ..CoreOptions::default()
    })
    .await;
    let harness = core.url().replace("127.0.0.1", HOST_LOOPBACK);
    set_env(&mut ex, "NYLORUN_HARNESS_URL", &harness);
    // Nothing listens there: no turn runs.
    let nowhere = format!("http://{HOST_LOOPBACK}:9");
    set_env(&mut ex, "NYLORUN_GATES_URL", &nowhere);
    set_env(&mut ex, "NYLORUN_EGRESS_PROXY", &nowhere);
    let (name, spec) = pod_specs(&ex).into_iter().next().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mut launch = launch::launch(&ex, &name, spec, root.path());
    launch.flags.extend(extra.iter().cloned());
    let container = image.start_bare(&launch.flags, &launch.args).await;
    container
        .wait_log("podhost pod starting", STARTS_WITHIN)
        .await;
    // Connected: podhost asks for work.
    core.wait_request(0, "lease").await;
    assert_up_and_ready(image, &container, &spec["containers"][0]).await;
    assert_stops_within_grace(image, &container, spec).await;
    container.logs().await
}

/// The confinement level podhost logged at start.
fn confinement(logs: &str) -> &str {
    logs.lines()
        .find(|l| l.contains("are confined"))
        .unwrap_or_else(|| panic!("no confinement level logged:\n{logs}"))
}

#[tokio::test]
async fn the_pod_example_joins_and_is_ready() {
    let Some(image) = image().await else { return };
    run_pod_example(image, &[]).await;
}

#[tokio::test]
async fn the_pod_example_falls_back_to_landlock_where_namespaces_are_refused() {
    let Some(image) = image().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let profile = docker_like_seccomp(dir.path());
    let extra = [format!("--security-opt=seccomp={}", profile.display())];
    let logs = run_pod_example(image, &extra).await;
    let level = confinement(&logs);
    assert!(level.contains("namespaces none, network host"), "{level}");
    println!("{level}");
}
