#!/usr/bin/env python3
"""Static checks that a deployment rendered from deploy/ or helm/specd would speculate.

specd speculates only when it reaches the upstream server, has the served model's
tokenizer, and speculation is not off; a deployment that misses one of them still serves
(as a plain proxy), so these checks read the rendered files instead of trusting it.

    deploy_checks.py helm RENDERED.yaml [--reasoning-parser P] [--tool-call-parser P]
    deploy_checks.py compose-gpu CONFIG.yaml [--reasoning-parser P] [--tool-call-parser P]
    deploy_checks.py compose-cpu CONFIG.yaml [...]     (CONFIG: docker-compose config output)
"""
import argparse
import posixpath
import subprocess
import sys

import yaml


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def under(path, folder):
    """Is path inside folder (or folder itself)?"""
    path, folder = posixpath.normpath(path), posixpath.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def env_of(c):
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def arg_value(args, *names):
    for a in args:
        for n in names:
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def check_helm(path, reasoning, tool):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    spec = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    specd = containers.pop("specd")
    env = env_of(specd)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}

    # speculation not off
    if env.get("SPECD_SPECULATION") == "off":
        fail("SPECD_SPECULATION is off")

    # readiness on /readyz, on specd's listening port
    listen_port = int(env["SPECD_LISTEN"].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in specd["ports"]}
    probe = specd["readinessProbe"]["httpGet"]
    if probe["path"] != "/readyz":
        fail(f"readiness probe on {probe['path']}, not /readyz")
    if ports.get(probe["port"], probe["port"]) != listen_port:
        fail(f"readiness probe port {probe['port']} is not specd's port {listen_port}")

    # the tokenizer: a path on a volume mounted into specd
    tok = env.get("SPECD_TOKENIZER")
    if not tok or not tok.startswith("/"):
        fail(f"SPECD_TOKENIZER is not an absolute path: {tok!r}")
    mounts = [m for m in specd.get("volumeMounts", []) if under(tok, m["mountPath"])]
    if not mounts:
        fail(f"SPECD_TOKENIZER {tok} is on no volume mounted into specd")
    mount = mounts[0]
    if mount["name"] not in volumes:
        fail(f"specd mounts volume {mount['name']}, which the pod does not define")

    upstream = env["SPECD_UPSTREAM"]
    if containers:  # sidecar
        if len(containers) != 1:
            fail(f"expected one upstream container, got {list(containers)}")
        (server,) = containers.values()
        args = server.get("args", [])
        port = arg_value(args, "--port")
        if upstream != f"http://127.0.0.1:{port}":
            fail(f"specd's upstream {upstream} is not the server's --port {port}")
        if int(port) not in [p["containerPort"] for p in server.get("ports", [])]:
            fail(f"the server's --port {port} is not a containerPort")
        # the server serves the folder specd reads the tokenizer from, on the same volume
        model = arg_value(args, "--model", "--model-path")
        if not model or not under(tok, model):
            fail(f"the tokenizer {tok} is not in the folder the server serves ({model})")
        smounts = [m for m in server.get("volumeMounts", [])
                   if m["name"] == mount["name"] and m["mountPath"] == mount["mountPath"]]
        if not smounts:
            fail(f"the server does not mount volume {mount['name']} at {mount['mountPath']}")
        # a hub id is downloaded there first, by an init container on the same volume
        inits = spec.get("initContainers", [])
        if "model-download" in [i["name"] for i in inits]:
            init = next(i for i in inits if i["name"] == "model-download")
            if init["command"][-1] != model:
                fail(f"the download goes to {init['command'][-1]}, the server serves {model}")
            if not any(m["name"] == mount["name"] and m["mountPath"] == mount["mountPath"]
                       for m in init["volumeMounts"]):
                fail("the download container does not write to the shared volume")
        check_parsers(args, env, reasoning, tool, vllm=arg_value(args, "--model") is not None)
    else:  # standalone
        if not upstream.startswith("http"):
            fail(f"bad upstream {upstream}")
    print(f"ok: specd -> {upstream}, tokenizer {tok} on volume {mount['name']}, "
          f"speculation {env.get('SPECD_SPECULATION')}, readiness /readyz")


def compose_services(path):
    return yaml.safe_load(open(path))["services"]


def named_mount(volumes, target):
    """(source, target) of the volume entry mounting at target, from compose config."""
    for v in volumes:
        if isinstance(v, dict):
            if v["target"] == target:
                return v["source"], v["target"]
        else:
            parts = v.split(":")
            if parts[1] == target:
                return parts[0], parts[1]
    return None


def vllm_argv(vllm):
    """vLLM's flags as the container gets them: the compose file's entrypoint script is run
    (with `sh`, vLLM's environment, and printf in place of the server)."""
    entry, command = vllm.get("entrypoint"), vllm["command"]
    flags = [a for a in command if a.startswith("--")]
    if not entry:
        return flags
    if entry[:2] != ["/bin/sh", "-c"]:
        fail(f"vLLM's entrypoint is not a shell script: {entry}")
    # `docker-compose config` keeps `$$` (a literal `$` in the container) escaped.
    script = entry[2].replace("$$", "$")
    env = {k: str(v) for k, v in (vllm.get("environment") or {}).items()}
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run(["sh", "-c", script, *entry[3:], "printf", "%s\\n", *flags],
                         env=env, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def check_parser_names(args, env, reasoning, tool):
    """The output parsers reach the server and specd alike: the values wanted, on both (an
    empty variable counts as unset, for specd as for a shell)."""
    for flag, envname, want in (("--reasoning-parser", "SPECD_REASONING_PARSER", reasoning),
                                ("--tool-call-parser", "SPECD_TOOL_CALL_PARSER", tool)):
        if arg_value(args, flag) != want:
            fail(f"server {flag} is {arg_value(args, flag)!r}, expected {want!r}")
        if (env.get(envname) or None) != want:
            fail(f"specd {envname} is {env.get(envname)!r}, expected {want!r}")


def check_parsers(args, env, reasoning, tool, vllm=True):
    """check_parser_names, and the server's tool-call parser enabled and known to specd:
    vLLM's --enable-auto-tool-choice (SGLang has no such flag)."""
    check_parser_names(args, env, reasoning, tool)
    if not vllm:
        if tool and env.get("SPECD_ENABLE_AUTO_TOOL_CHOICE") != "true":
            fail("specd is not told that the server's tool-call parser is enabled "
                 "(SPECD_ENABLE_AUTO_TOOL_CHOICE)")
        return
    auto = "--enable-auto-tool-choice" in args
    if auto != (str(env.get("SPECD_ENABLE_AUTO_TOOL_CHOICE")).lower() == "true"):
        fail(f"the server {'runs' if auto else 'does not run'} --enable-auto-tool-choice, "
             f"specd's SPECD_ENABLE_AUTO_TOOL_CHOICE is {env.get('SPECD_ENABLE_AUTO_TOOL_CHOICE')!r}")
    if tool and not auto:
        fail("a vLLM tool-call parser needs --enable-auto-tool-choice")


def check_compose(path, cpu, reasoning, tool):
    svc = compose_services(path)
    specd, vllm = svc["specd"], svc["vllm"]
    env = specd["environment"]
    if env.get("SPECD_SPECULATION") == "off":
        fail("SPECD_SPECULATION is off")
    if env["SPECD_UPSTREAM"] != "http://vllm:8000":
        fail(f"specd's upstream is {env['SPECD_UPSTREAM']}")
    if arg_value(vllm["command"], "--port") != "8000":
        fail("vLLM does not listen on 8000")
    tok = env.get("SPECD_TOKENIZER")
    if not tok or not tok.startswith("/"):
        fail(f"SPECD_TOKENIZER is not an absolute path: {tok!r}")
    model = arg_value(vllm["command"], "--model")
    if not model or not under(tok, model):
        fail(f"the tokenizer {tok} is not in the folder vLLM serves ({model})")
    # the same volume at the same place in both
    shared = None
    for v in specd.get("volumes", []):
        src, tgt = (v["source"], v["target"]) if isinstance(v, dict) else v.split(":")[:2]
        if under(tok, tgt):
            shared = (src, tgt)
    if not shared:
        fail(f"SPECD_TOKENIZER {tok} is on no volume of specd")
    if named_mount(vllm.get("volumes", []), shared[1]) != shared:
        fail(f"vLLM does not mount {shared[0]} at {shared[1]} as specd does")
    if not cpu:
        model_svc = svc.get("model")
        if not model_svc:
            fail("no `model` download service")
        if model_svc["command"][-1] != model:
            fail(f"the download goes to {model_svc['command'][-1]}, vLLM serves {model}")
        if named_mount(model_svc.get("volumes", []), shared[1]) != shared:
            fail("the download service does not write to the shared volume")
        if vllm["depends_on"]["model"]["condition"] != "service_completed_successfully":
            fail("vLLM does not wait for the download")
    for name, s in svc.items():
        for p in s.get("ports", []):
            ip = p.get("host_ip") if isinstance(p, dict) else str(p).split(":")[0]
            if ip != "127.0.0.1":
                fail(f"{name} publishes {p} beyond loopback")
    if specd["depends_on"]["vllm"]["condition"] != "service_healthy":
        fail("specd does not wait for a healthy vLLM")
    args = vllm_argv(vllm)
    if arg_value(args, "--model") != model:
        fail(f"vLLM's entrypoint changes its flags: {args}")
    check_parsers(args, env, reasoning, tool)
    print(f"ok: specd -> vllm:8000, tokenizer {tok} on {shared[0]} shared with vLLM ({model}), "
          f"parsers reasoning={reasoning} tools={tool} on both")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("helm")
    h.add_argument("file")
    h.add_argument("--reasoning-parser")
    h.add_argument("--tool-call-parser")
    for name in ("compose-gpu", "compose-cpu"):
        c = sub.add_parser(name)
        c.add_argument("file")
        c.add_argument("--reasoning-parser")
        c.add_argument("--tool-call-parser")
    a = ap.parse_args()
    if a.cmd == "helm":
        check_helm(a.file, a.reasoning_parser, a.tool_call_parser)
    else:
        check_compose(a.file, a.cmd == "compose-cpu", a.reasoning_parser, a.tool_call_parser)


if __name__ == "__main__":
    main()
