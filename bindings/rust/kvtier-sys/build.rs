//! Finds kvtier and runs bindgen over its header.
//!
//! The library: $KVTIER_LIB_DIR, else `pkg-config kvtier` (an installed kvtier, or a build
//! tree through PKG_CONFIG_PATH=<build>), else this repository's build/src. The header:
//! $KVTIER_INCLUDE_DIR, else pkg-config's includedir, else this repository's include/.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn pkg_config(var: &str) -> Option<String> {
    let out = Command::new("pkg-config").args(["--variable", var, "kvtier"]).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let repo = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../..");
    for v in ["KVTIER_LIB_DIR", "KVTIER_INCLUDE_DIR", "PKG_CONFIG_PATH"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let lib_dir = env::var("KVTIER_LIB_DIR")
        .ok()
        .or_else(|| pkg_config("libdir"))
        .unwrap_or_else(|| repo.join("build/src").display().to_string());
    let include_dir = env::var("KVTIER_INCLUDE_DIR")
        .ok()
        .or_else(|| pkg_config("includedir"))
        .unwrap_or_else(|| repo.join("include").display().to_string());
    let header = PathBuf::from(&include_dir).join("kvtier.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rustc-link-search=native={lib_dir}");
    println!("cargo:rustc-link-lib=dylib=kvtier");
    // Tests and examples of this crate find the library at run time; dependents read
    // DEP_KVTIER_LIB_DIR and set their own rpath.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    println!("cargo:lib_dir={lib_dir}");

    let bindings = bindgen::Builder::default()
        .header(header.display().to_string())
        .allowlist_function("kvt_.*")
        .allowlist_type("kvt_.*")
        .allowlist_var("KVT_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on {}: {e:?}", header.display()));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(out).expect("cannot write the bindings");
}
