//! A pod's container of a README example started from the test image the way the kubelet
//! starts it (see the module above for what is kept and what is replaced).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Example, POD_UID, data_of, object};

/// The `podman run` flags and entrypoint arguments of one container.
pub struct Launch {
    pub flags: Vec<String>,
    pub args: Vec<String>,
}

/// The user, groups and security context of container `c` in a pod with context `pod`.
fn security_flags(pod: &Value, c: &Value) -> Vec<String> {
    let own = &c["securityContext"];
    let either = |key: &str| match &own[key] {
        Value::Null => &pod[key],
        v => v,
    };
    let mut flags = Vec::new();
    match (either("runAsUser").as_u64(), either("runAsGroup").as_u64()) {
        (Some(u), Some(g)) => flags.push(format!("--user={u}:{g}")),
        (Some(u), None) => flags.push(format!("--user={u}")),
        _ => {}
    }
    if let Some(g) = pod["fsGroup"].as_u64() {
        flags.push(format!("--group-add={g}"));
    }
    if own["readOnlyRootFilesystem"] == true {
        // podman's own writable /run, /var/tmp and /tmp would hide a path the pod lacks.
        flags.extend(["--read-only", "--read-only-tmpfs=false"].map(String::from));
    }
    if own["privileged"] == true {
        flags.push("--privileged".to_owned());
    }
    for cap in super::strings(&own["capabilities"]["drop"]) {
        flags.push(format!("--cap-drop={cap}"));
    }
    for cap in super::strings(&own["capabilities"]["add"]) {
        flags.push(format!("--cap-add={cap}"));
    }
    if own["allowPrivilegeEscalation"] == false {
        flags.push("--security-opt=no-new-privileges".to_owned());
    }
    // RuntimeDefault is podman's default profile; anything else is not run here.
    let seccomp = either("seccompProfile")["type"].as_str();
    assert!(
        matches!(seccomp, None | Some("RuntimeDefault")),
        "seccompProfile {seccomp:?} is not run by this test"
    );
    flags
}

/// `--memory` and `--cpus` from the container's limits (Kubernetes quantities).
fn limit_flags(c: &Value) -> Vec<String> {
    let limits = &c["resources"]["limits"];
    let mut flags = Vec::new();
    if let Some(memory) = limits["memory"].as_str() {
        let (n, unit) = memory.split_at(
            memory
                .find(|ch: char| !ch.is_ascii_digit())
                .unwrap_or(memory.len()),
        );
        let unit = match unit {
            "Gi" => "g",
            "Mi" => "m",
            "Ki" => "k",
            "" => "b",
            other => panic!("memory limit unit {other:?} is not run by this test"),
        };
        flags.push(format!("--memory={n}{unit}"));
    }
    if let Some(cpu) = limits["cpu"].as_str() {
        let cpus = match cpu.strip_suffix('m') {
            Some(milli) => milli.parse::<f64>().unwrap() / 1000.0,
            None => cpu.parse().unwrap(),
        };
        flags.push(format!("--cpus={cpus}"));
    }
    flags
}

/// The value of env entry `e` as the kubelet resolves it from the block's objects.
fn env_value(ex: &Example, pod_name: &str, e: &Value) -> String {
    if let Some(v) = e["value"].as_str() {
        return v.to_owned();
    }
    let from = &e["valueFrom"];
    for (field, kind) in [("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")] {
        let r = &from[field];
        if r.is_object() {
            let name = r["name"].as_str().unwrap();
            let key = r["key"].as_str().unwrap();
            let obj = object(ex, kind, name).unwrap_or_else(|| panic!("no {kind} {name}"));
            return data_of(obj, key)
                .unwrap_or_else(|| panic!("{kind} {name} has no key {key}"))
                .to_owned();
        }
    }
    match from["fieldRef"]["fieldPath"].as_str() {
        Some("metadata.uid") => POD_UID.to_owned(),
        Some("metadata.name") => pod_name.to_owned(),
        other => panic!("env {} from {other:?} is not run by this test", e["name"]),
    }
}

/// Makes `dir` as the kubelet leaves a volume for a pod with `fs_group`: root's, the group's,
/// setgid, with `mode`.
fn volume_dir(dir: &Path, fs_group: Option<u32>, mode: u32) {
    std::fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::chown(dir, Some(0), fs_group).unwrap();
    let setgid = if fs_group.is_some() { 0o2000 } else { 0 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | setgid)).unwrap();
}

/// A Secret's or ConfigMap's keys as files in `dir`, with `mode` (a Secret volume's
/// `defaultMode`), root's and the `fs_group`'s.
fn object_files(dir: &Path, obj: &Value, fs_group: Option<u32>, mode: u32) {
    volume_dir(dir, fs_group, 0o755);
    for field in ["stringData", "data"] {
        for key in obj[field].as_object().into_iter().flatten().map(|(k, _)| k) {
            let file = dir.join(key);
            std::fs::write(&file, data_of(obj, key).unwrap()).unwrap();
            std::os::unix::fs::chown(&file, Some(0), fs_group).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

/// A volume's `defaultMode` as Kubernetes reads it: YAML 1.1 takes `0440` as octal, which a
/// YAML 1.2 reader gives as a string.
fn default_mode(v: &Value) -> u32 {
    match v {
        Value::Null => 0o644,
        Value::String(octal) => u32::from_str_radix(octal, 8).unwrap(),
        v => u32::try_from(v.as_u64().unwrap()).unwrap(),
    }
}

/// The host directory (under `root`) that stands for volume `v`, and whether it is mounted
/// read-only whatever the mount says.
fn volume_source(ex: &Example, root: &Path, v: &Value, fs_group: Option<u32>) -> (PathBuf, bool) {
    let name = v["name"].as_str().unwrap();
    if v["emptyDir"].is_object() {
        let dir = root.join(format!("emptydir-{name}"));
        volume_dir(&dir, fs_group, 0o777);
        return (dir, false);
    }
    if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
        let dir = root.join(format!("claim-{claim}"));
        if !dir.exists() {
            volume_dir(&dir, fs_group, 0o775);
        }
        return (dir, false);
    }
    for (field, kind, key) in [
        ("secret", "Secret", "secretName"),
        ("configMap", "ConfigMap", "name"),
    ] {
        if let Some(obj_name) = v[field][key].as_str() {
            let obj = object(ex, kind, obj_name).unwrap_or_else(|| panic!("no {kind} {obj_name}"));
            let dir = root.join(format!("{field}-{name}"));
            object_files(&dir, obj, fs_group, default_mode(&v[field]["defaultMode"]));
            return (dir, true);
        }
    }
    panic!("volume {name} is of a kind this test does not run: {v}");
}

/// `--volume` flags for the container's mounts.
fn volume_flags(ex: &Example, root: &Path, spec: &Value, c: &Value) -> Vec<String> {
    let fs_group = spec["securityContext"]["fsGroup"]
        .as_u64()
        .map(|g| g as u32);
    let mut flags = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = &m["name"];
        let v = spec["volumes"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == *name))
            .unwrap_or_else(|| panic!("no volume {name}"));
        let (mut dir, read_only) = volume_source(ex, root, v, fs_group);
        if let Some(sub) = m["subPath"].as_str() {
            dir = dir.join(sub);
            if !dir.exists() {
                volume_dir(&dir, fs_group, 0o775);
            }
        }
        let ro = if read_only || m["readOnly"] == true {
            ":ro"
        } else {
            ""
        };
        flags.push(format!(
            "--volume={}:{}{ro}",
            dir.display(),
            m["mountPath"].as_str().unwrap()
        ));
    }
    flags
}

/// How the container of pod `pod_name` (spec `spec`) in example `ex` is started, its volumes'
/// directories under `root` (pass the same `root` to start replicas that share their claims).
pub fn launch(ex: &Example, pod_name: &str, spec: &Value, root: &Path) -> Launch {
    assert!(
        spec["initContainers"].is_null() && spec["containers"].as_array().map(Vec::len) == Some(1),
        "{}: {pod_name} has more than one container, which this test does not run",
        ex.heading
    );
    let c = &spec["containers"][0];
    let mut flags = vec![
        "--pull=never".to_owned(),
        // The host's loopback (the fakes, the test cluster) as 10.0.2.2, the ports the
        // example names in the container's own network.
        "--network=slirp4netns:allow_host_loopback=true".to_owned(),
    ];
    flags.extend(security_flags(&spec["securityContext"], c));
    flags.extend(limit_flags(c));
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap();
        flags.push(format!("--env={name}={}", env_value(ex, pod_name, e)));
    }
    flags.extend(volume_flags(ex, root, spec, c));
    // `command` replaces the image's entrypoint, `args` its command (the image has none).
    let strings =
        |v: &Value| -> Vec<String> { super::strings(v).into_iter().map(str::to_owned).collect() };
    if c["command"].is_array() {
        flags.push(format!("--entrypoint={}", c["command"]));
    }
    Launch {
        flags,
        args: strings(&c["args"]),
    }
}
