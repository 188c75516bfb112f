//! Finds Nereid's own shared libraries — the Python stub's core (`libnereid_stub_core.so`) and
//! the PyTorch backend (`libnereid_torch_backend.so`) — without environment variables, the way
//! Triton finds its backends: next to the running executable (a deployment copies them
//! together), then the install directory `/opt/nereid` (the container image's), then the
//! target directory of the build that produced this binary (data-plane/build.rs records it), so
//! `cargo build` output runs in place.
//!
//! ```text
//!  locate(file) ─► <dir of current_exe>/file ─► /opt/nereid/file ─► <target>/<profile>/file
//!               ─► the first that exists, or Err(every path looked at)
//! ```

use std::path::PathBuf;

/// Where the container image installs the binary and its libraries.
pub(crate) const INSTALL_DIR: &str = "/opt/nereid";

/// `<target>/<profile>` of this build (data-plane/build.rs).
const BUILD_PROFILE_DIR: Option<&str> = option_env!("NEREID_BUILD_PROFILE_DIR");

/// The places `file` is looked for, in order.
pub(crate) fn candidates(file: &str) -> Vec<PathBuf> {
    let beside_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(file)));
    let mut places: Vec<PathBuf> = beside_exe.into_iter().collect();
    for dir in [Some(INSTALL_DIR), BUILD_PROFILE_DIR].into_iter().flatten() {
        let path = PathBuf::from(dir).join(file);
        if !places.contains(&path) {
            places.push(path);
        }
    }
    places
}

/// The first existing copy of `file`, or every place looked at.
pub(crate) fn locate(file: &str) -> Result<PathBuf, Vec<PathBuf>> {
    let places = candidates(file);
    places
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .ok_or(places)
}

/// `a, b, c`: the places of a failed [`locate`], for a message.
pub(crate) fn list(places: &[PathBuf]) -> String {
    let places: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
    places.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executable_directory_comes_first_and_a_missing_file_names_every_place() {
        let places = match locate("libnereid_no_such_library.so") {
            Err(places) => places,
            Ok(path) => panic!("found {}", path.display()),
        };
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(PathBuf::from));
        assert_eq!(places.first().and_then(|p| p.parent()), exe_dir.as_deref());
        assert!(places.contains(&PathBuf::from("/opt/nereid/libnereid_no_such_library.so")));
        assert!(list(&places).contains("/opt/nereid/libnereid_no_such_library.so"));
    }
}
