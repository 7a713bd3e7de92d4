//! Compiles `cpp/tensor_check.cpp` (tensor metadata checks for guards) and
//! `cpp/torch_state.cpp` (thread-local torch state read on every call; see each file) against
//! the headers of the torch that dynamo-rs is built for, and links them to torch's `libc10`
//! and `libtorch_cpu`.
//!
//! torch is found through the Python interpreter the extension is built for: `PYO3_PYTHON`
//! (maturin sets it), else the active virtual environment's, else `python3` — or directly
//! through `DYNAMO_RS_TORCH_DIR` (the directory of torch's `__init__.py`).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> String {
    if let Ok(python) = env::var("PYO3_PYTHON") {
        return python;
    }
    if let Ok(venv) = env::var("VIRTUAL_ENV") {
        let python = Path::new(&venv).join("bin").join("python");
        if python.exists() {
            return python.to_string_lossy().into_owned();
        }
    }
    "python3".into()
}

/// Asks the interpreter where torch and Python's headers are, without importing torch.
fn locate() -> (PathBuf, PathBuf) {
    let script = "import importlib.util, sysconfig\n\
                  spec = importlib.util.find_spec('torch')\n\
                  print(spec.submodule_search_locations[0] if spec else '')\n\
                  print(sysconfig.get_paths()['include'])";
    let python = python();
    let output = Command::new(&python)
        .args(["-c", script])
        .output()
        .unwrap_or_else(|e| panic!("dynamo-rs build: cannot run {python} to find torch: {e}"));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut lines = text.lines();
    let torch = lines.next().unwrap_or("").trim().to_string();
    let include = lines.next().unwrap_or("").trim().to_string();
    let torch = env::var("DYNAMO_RS_TORCH_DIR").unwrap_or(torch);
    if torch.is_empty() {
        panic!(
            "dynamo-rs build: torch is not installed for {python}; install torch==2.15.0 first \
             (or set DYNAMO_RS_TORCH_DIR to the directory of torch's __init__.py)"
        );
    }
    (PathBuf::from(torch), PathBuf::from(include))
}

fn main() {
    println!("cargo:rerun-if-changed=cpp/tensor_check.cpp");
    println!("cargo:rerun-if-changed=cpp/torch_state.cpp");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DYNAMO_RS_TORCH_DIR");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let (torch, python_include) = locate();
    let torch_include = torch.join("include");
    let torch_lib = torch.join("lib");
    if !torch_include.join("c10").exists() {
        panic!(
            "dynamo-rs build: no C++ headers under {} (a torch without its include directory?)",
            torch_include.display()
        );
    }
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file("cpp/tensor_check.cpp")
        .file("cpp/torch_state.cpp")
        .include(&torch_include)
        .include(torch_include.join("torch/csrc/api/include"))
        .include(&python_include)
        // torch's wheels are built with the C++11 ABI of libstdc++.
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
        .compile("dynamo_rs_cpp");
    println!("cargo:rustc-link-search=native={}", torch_lib.display());
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    // Installed: torch sits next to dynamo_rs in site-packages. Editable (`maturin develop`):
    // the build's own torch. Either way torch has usually loaded libc10 already.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN/../torch/lib");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,-rpath,{}",
        torch_lib.display()
    );
}
