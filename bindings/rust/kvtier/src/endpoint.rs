//! The management endpoint: a manager (and its connector) served on a Unix socket, one JSON
//! object per line each way (docs/EVENTS.md), for kvtier-console and scripts.
use std::marker::PhantomData;
use std::path::Path;
use std::ptr;
use std::sync::Arc;

use kvtier_sys as sys;

use crate::observe::c_path;
use crate::{check, versioned, Connector, Manager, Result};

/// Who may connect and what a client may cost (kvt_endpoint_config); `Default` gives the
/// library's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Clients served at once, 1 ..= 4096; one more gets an error line and is closed.
    pub max_clients: u32,
    /// A user allowed besides the process's own and root (the socket is then mode 0666,
    /// and the uid check alone keeps others out); None: none.
    pub allow_uid: Option<u32>,
    /// A group whose members may connect too (the socket's group, mode 0660); None: none.
    pub allow_gid: Option<u32>,
    /// Replies held for a client that has not read them before its next requests wait:
    /// 4 KiB ..= 64 MiB.
    pub client_buffer_bytes: u64,
}

fn config_defaults() -> sys::kvt_endpoint_config {
    let mut c = std::mem::MaybeUninit::<sys::kvt_endpoint_config>::zeroed();
    unsafe {
        sys::kvt_endpoint_config_init_sized(c.as_mut_ptr(), std::mem::size_of::<sys::kvt_endpoint_config>());
        c.assume_init()
    }
}

impl Default for EndpointConfig {
    fn default() -> EndpointConfig {
        let c = config_defaults();
        EndpointConfig {
            max_clients: c.max_clients,
            allow_uid: u32::try_from(c.allow_uid).ok(),
            allow_gid: u32::try_from(c.allow_gid).ok(),
            client_buffer_bytes: c.client_buffer_bytes,
        }
    }
}

/// The endpoint's counters (kvt_endpoint_stats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointStats {
    /// Connected now.
    pub clients: u64,
    /// Turned away: beyond max_clients, or a user not allowed.
    pub refused: u64,
    /// Closed for a line over 64 KiB, or replies unread for 30 s.
    pub dropped: u64,
    /// The most reply bytes one client has had waiting.
    pub peak_buffered_bytes: u64,
}

/// Serves a manager, and optionally its connector, on a Unix socket from threads of its
/// own; dropping it stops serving and removes the socket and its lock. It borrows both, so
/// it is closed before them. Send and Sync: stats may be read from any thread.
///
/// It also holds a lease on both until it is closed: an endpoint never dropped
/// (`mem::forget`) goes on serving, and its connector and manager are leaked rather than
/// destroyed when dropped (see "Leaked children" on [`Manager`]).
pub struct Endpoint<'a> {
    e: *mut sys::kvt_endpoint,
    /// The manager's lease and the connector's, released after the close in Drop.
    _leases: (Arc<crate::Lease>, Option<Arc<()>>),
    _borrows: PhantomData<(&'a Manager, Option<&'a Connector<'a>>)>,
}

unsafe impl Send for Endpoint<'_> {}
unsafe impl Sync for Endpoint<'_> {}

impl<'a> Endpoint<'a> {
    /// Serves `m` (and `c`, a connector over it) at `path` with the default config.
    pub fn open(m: &'a Manager, c: Option<&'a Connector<'_>>, path: &Path) -> Result<Endpoint<'a>> {
        let p = c_path(path)?;
        let mut e = ptr::null_mut();
        check(unsafe {
            sys::kvt_endpoint_open(&mut e, m.m, c.map_or(ptr::null_mut(), |c| c.c), p.as_ptr())
        })?;
        Ok(Endpoint { e, _leases: leases(m, c), _borrows: PhantomData })
    }

    /// [`Endpoint::open`] with `cfg`.
    pub fn open_with(m: &'a Manager, c: Option<&'a Connector<'_>>, path: &Path,
                     cfg: &EndpointConfig) -> Result<Endpoint<'a>> {
        let p = c_path(path)?;
        let mut raw = config_defaults();
        raw.max_clients = cfg.max_clients;
        raw.allow_uid = cfg.allow_uid.map_or(-1, i64::from);
        raw.allow_gid = cfg.allow_gid.map_or(-1, i64::from);
        raw.client_buffer_bytes = cfg.client_buffer_bytes;
        let mut e = ptr::null_mut();
        check(unsafe {
            sys::kvt_endpoint_open_with(&mut e, m.m, c.map_or(ptr::null_mut(), |c| c.c),
                                        p.as_ptr(), &raw)
        })?;
        Ok(Endpoint { e, _leases: leases(m, c), _borrows: PhantomData })
    }

    pub fn stats(&self) -> Result<EndpointStats> {
        let mut s: sys::kvt_endpoint_stats = versioned();
        check(unsafe { sys::kvt_endpoint_stats_get(&mut s, self.e) })?;
        Ok(EndpointStats { clients: s.clients, refused: s.refused, dropped: s.dropped,
                           peak_buffered_bytes: s.peak_buffered_bytes })
    }
}

fn leases(m: &Manager, c: Option<&Connector<'_>>) -> (Arc<crate::Lease>, Option<Arc<()>>) {
    (Arc::clone(&m.lease), c.map(|c| Arc::clone(&c.lease)))
}

impl Drop for Endpoint<'_> {
    fn drop(&mut self) {
        unsafe { sys::kvt_endpoint_close(self.e) }
    }
}
