//! The library's directory comes from kvtier-sys (links = "kvtier"): give this crate's tests
//! and examples an rpath to it.
fn main() {
    if let Ok(dir) = std::env::var("DEP_KVTIER_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
