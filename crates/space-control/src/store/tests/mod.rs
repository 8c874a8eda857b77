use super::*;

fn t(name: &str) -> TenantName {
    name.parse().unwrap()
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn temp_store() -> (tempfile::TempDir, std::path::PathBuf, Store) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state").join("space.db");
    let store = Store::open(&path).unwrap();
    (dir, path, store)
}

#[path = "../../../tests/common/postgres.rs"]
mod test_postgres;

/// A database the tests that hold for both backends run against; it can be opened again, as
/// a restarted server (or another replica) would.
enum Db {
    Sqlite {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
    },
    Postgres(String),
}

impl Db {
    fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join("space.db");
        Db::Sqlite { _dir: dir, path }
    }

    fn postgres() -> Db {
        Db::Postgres(test_postgres::database())
    }

    /// Another, empty database of the same kind.
    fn another(&self) -> Db {
        match self {
            Db::Sqlite { .. } => Db::sqlite(),
            Db::Postgres(_) => Db::postgres(),
        }
    }

    async fn open(&self) -> Store {
        match self {
            Db::Sqlite { path, .. } => Store::open(path).unwrap(),
            Db::Postgres(url) => Store::connect(url).await.unwrap(),
        }
    }
}

/// Runs each named `async fn(Db)` once on SQLite and once on PostgreSQL.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Db::sqlite()).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Db::postgres()).await
            }
        }
    )*};
}

on_both!(
    json_shapes_follow_the_api,
    reopen_keeps_everything,
    tenants_create_list_update,
    tenant_with_key_is_all_or_nothing,
    keys_authenticate_and_fail_with_the_right_variant,
    the_last_admin_key_is_never_revoked,
    labels_are_bounded,
    bootstrap_happens_once,
    sandbox_ownership_is_per_tenant,
    audit_queries_are_isolated_and_filtered,
    audit_limit_caps_at_1000,
    audit_fields_are_bounded,
    concurrent_writers_share_one_store,
    ports_are_looked_up_by_token_hash_and_replaced,
    volumes_are_the_tenants_and_unique_by_name,
);

#[test]
fn tenant_names_are_validated() {
    for ok in ["a", "0", "acme", "a-b-c", "9lives", &"a".repeat(40)] {
        let n: TenantName = ok.parse().unwrap();
        assert_eq!(n.as_str(), ok);
        assert_eq!(n.to_string(), ok);
    }
    for bad in [
        "",
        "-a",
        "A",
        "acme_corp",
        "acme corp",
        "a.b",
        "é",
        &"a".repeat(41),
        "acme\n",
    ] {
        assert!(
            matches!(bad.parse::<TenantName>(), Err(StoreError::Invalid(_))),
            "{bad:?} accepted"
        );
    }
    let n: TenantName = serde_json::from_str("\"acme\"").unwrap();
    assert_eq!(serde_json::to_string(&n).unwrap(), "\"acme\"");
    assert!(serde_json::from_str::<TenantName>("\"Acme\"").is_err());
}

async fn json_shapes_follow_the_api(db: Db) {
    let store = db.open().await;
    let tenant = store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    let v = serde_json::to_value(&tenant).unwrap();
    assert_eq!(v["name"], "acme");
    assert_eq!(v["quotas"]["max_sandboxes"], 100);
    assert_eq!(v["quotas"]["max_vcpus"], 64);
    assert_eq!(v["quotas"]["max_memory_mib"], 65536);
    assert!(v["created_unix_ms"].as_u64().unwrap() > 0);

    let created = store
        .create_key(&t("acme"), false, Some("ci"))
        .await
        .unwrap();
    let v = serde_json::to_value(&created).unwrap();
    let obj = v.as_object().unwrap();
    let mut fields: Vec<&str> = obj.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "admin",
            "created_unix_ms",
            "id",
            "key",
            "label",
            "revoked_unix_ms",
            "tenant"
        ]
    );
    assert_eq!(v["revoked_unix_ms"], serde_json::Value::Null);
    assert_eq!(v["label"], "ci");
    let back: KeyCreated = serde_json::from_value(v).unwrap();
    assert_eq!(back, created);
    let listed = serde_json::to_value(&created.info).unwrap();
    assert!(listed.get("key").is_none());
}

async fn reopen_keeps_everything(db: Db) {
    let store = db.open().await;
    let acme = t("acme");
    let quotas = Quotas {
        max_sandboxes: 3,
        max_vcpus: 4,
        max_memory_mib: 2048,
        max_suspended_ms: None,
        max_volume_mib: 4096,
    };
    store.create_tenant(&acme, quotas).await.unwrap();
    let key = store.create_key(&acme, true, Some("ops")).await.unwrap();
    let other = store.create_key(&acme, false, None).await.unwrap();
    store.revoke_key(&other.info.id).await.unwrap();
    store
        .add_sandbox("sb-0123456789abcdefghij", &acme)
        .await
        .unwrap();
    let ev = store
        .record(NewAuditEvent {
            tenant: Some(acme.clone()),
            key_id: Some(key.info.id.clone()),
            sandbox: Some("sb-0123456789abcdefghij".into()),
            operation: "sandbox.create".into(),
            result: "ok".into(),
            detail: Some("template minimal".into()),
        })
        .await
        .unwrap();
    let tenants_before = store.tenants().await.unwrap();
    let keys_before = store.keys(&acme).await.unwrap();
    let audit_before = store.audit(&AuditFilter::default()).await.unwrap();
    drop(store);

    let store = db.open().await;
    assert_eq!(store.tenants().await.unwrap(), tenants_before);
    assert_eq!(store.tenant(&acme).await.unwrap().unwrap().quotas, quotas);
    assert_eq!(store.keys(&acme).await.unwrap(), keys_before);
    assert_eq!(keys_before.len(), 2);
    let p = store.authenticate(Some(&bearer(&key.key))).await.unwrap();
    assert_eq!(
        p,
        Principal {
            tenant: acme.clone(),
            key_id: key.info.id.clone(),
            admin: true
        }
    );
    assert!(matches!(
        store.authenticate(Some(&bearer(&other.key))).await,
        Err(AuthError::Revoked { .. })
    ));
    assert_eq!(
        store
            .sandbox_tenant("sb-0123456789abcdefghij")
            .await
            .unwrap(),
        Some(acme.clone())
    );
    let audit = store.audit(&AuditFilter::default()).await.unwrap();
    assert_eq!(audit, audit_before);
    assert_eq!(audit[0].id, ev);
    // Ids keep increasing after a reopen.
    let ev2 = store
        .record(NewAuditEvent {
            operation: "auth".into(),
            result: "unauthorized".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(ev2 > ev);
}

#[tokio::test]
async fn database_file_is_private() {
    let (_dir, path, store) = temp_store();
    store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let wal = path.with_extension("db-wal");
    if let Ok(meta) = fs::metadata(&wal) {
        assert_eq!(
            meta.permissions().mode() & 0o077,
            0,
            "{wal:?} readable by others"
        );
    }
    drop(store);
    // An existing file with loose permissions is tightened on open.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let _store = Store::open(&path).unwrap();
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[tokio::test]
async fn database_settings() {
    let (_dir, _path, store) = temp_store();
    let conn = store.sqlite_conn();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let fk: i64 = conn
        .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
        .unwrap();
    assert_eq!(fk, 1);
    let sync: i64 = conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 1, "synchronous=NORMAL");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, i64::from(SCHEMA_VERSION));
}

#[tokio::test]
async fn newer_schema_is_refused_and_left_alone() {
    let (_dir, path, store) = temp_store();
    store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    drop(store);
    let newer = SCHEMA_VERSION + 1;
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", newer).unwrap();
    }
    let err = Store::open(&path).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    assert!(msg.contains(&format!("schema version {newer}")), "{msg}");
    assert!(msg.contains("newer"), "{msg}");
    // Nothing was changed: the version and the data are as they were.
    let conn = Connection::open(&path).unwrap();
    let v: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, newer);
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM tenants", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("space.db");
    fs::write(&path, vec![0x55u8; 8192]).unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Sqlite(_)), "{err:?}");
    assert_eq!(fs::read(&path).unwrap(), vec![0x55u8; 8192]);
}

async fn tenants_create_list_update(db: Db) {
    let store = db.open().await;
    assert!(store.tenants().await.unwrap().is_empty());
    assert_eq!(store.tenant(&t("acme")).await.unwrap(), None);
    let acme = store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    store
        .create_tenant(&t("beta"), Quotas::default())
        .await
        .unwrap();
    assert!(matches!(
        store.create_tenant(&t("acme"), Quotas::default()).await,
        Err(StoreError::Conflict(_))
    ));
    let names: Vec<String> = store
        .tenants()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["acme", "beta"]);
    let q = Quotas {
        max_sandboxes: 1,
        max_vcpus: 2,
        max_memory_mib: 512,
        max_suspended_ms: None,
        max_volume_mib: 1,
    };
    let updated = store.set_quotas(&t("acme"), q).await.unwrap();
    assert_eq!(updated.quotas, q);
    assert_eq!(updated.created_unix_ms, acme.created_unix_ms);
    assert_eq!(store.tenant(&t("acme")).await.unwrap().unwrap().quotas, q);
    assert!(matches!(
        store.set_quotas(&t("nobody"), q).await,
        Err(StoreError::NotFound { what: "tenant", .. })
    ));
    let huge = Quotas {
        max_memory_mib: u64::MAX,
        ..q
    };
    assert!(matches!(
        store.set_quotas(&t("acme"), huge).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.create_tenant(&t("gamma"), huge).await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(store.tenant(&t("acme")).await.unwrap().unwrap().quotas, q);
    assert_eq!(store.tenant(&t("gamma")).await.unwrap(), None);
}

async fn tenant_with_key_is_all_or_nothing(db: Db) {
    let store = db.open().await;
    let (tenant, key) = store
        .create_tenant_with_key(&t("acme"), Quotas::default(), false, Some("first"))
        .await
        .unwrap();
    assert_eq!(tenant.name, t("acme"));
    assert_eq!(key.info.tenant, t("acme"));
    assert!(!key.info.admin);
    let p = store.authenticate(Some(&bearer(&key.key))).await.unwrap();
    assert_eq!(p.tenant, t("acme"));
    // A bad label fails the key, and the tenant is not left behind without one.
    assert!(matches!(
        store
            .create_tenant_with_key(&t("beta"), Quotas::default(), false, Some("a\nb"))
            .await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(store.tenant(&t("beta")).await.unwrap(), None);
    assert!(matches!(
        store
            .create_tenant_with_key(&t("acme"), Quotas::default(), false, None)
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.keys(&t("acme")).await.unwrap().len(), 1);
}

async fn the_last_admin_key_is_never_revoked(db: Db) {
    let store = db.open().await;
    let boot = store.bootstrap(&t("default")).await.unwrap().unwrap();
    assert!(boot.info.admin);
    let acme = t("acme");
    store.create_tenant(&acme, Quotas::default()).await.unwrap();
    let user = store.create_key(&acme, false, None).await.unwrap();
    // The only admin key stays; a key that is not an admin's is revoked as before.
    let e = store.revoke_key(&boot.info.id).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::LastAdmin(id) if *id == boot.info.id),
        "{e}"
    );
    assert!(e.to_string().contains("space admin-key"), "{e}");
    assert!(store.authenticate(Some(&bearer(&boot.key))).await.is_ok());
    store.revoke_key(&user.info.id).await.unwrap();

    // With a second admin key (of any tenant) the first can go; then the second is the last.
    let other = store.create_key(&acme, true, None).await.unwrap();
    store.revoke_key(&boot.info.id).await.unwrap();
    assert!(matches!(
        store.revoke_key(&other.info.id).await,
        Err(StoreError::LastAdmin(_))
    ));
    // Revoking an already revoked admin key changes nothing and is no error.
    let again = store.revoke_key(&boot.info.id).await.unwrap();
    assert!(again.revoked_unix_ms.is_some());

    // Two admin keys revoked at once: exactly one revocation wins, one admin key is left.
    let store = std::sync::Arc::new(store);
    let mut survivor = other.info.id.clone();
    for _ in 0..5 {
        let fresh = store.create_key(&acme, true, None).await.unwrap().info.id;
        let revoke = |id: String| {
            let s = store.clone();
            tokio::spawn(async move { (id.clone(), s.revoke_key(&id).await) })
        };
        let (a, b) = tokio::join!(revoke(survivor.clone()), revoke(fresh));
        let (a, b) = (a.unwrap(), b.unwrap());
        let outcomes = [a.1.is_ok(), b.1.is_ok()];
        assert_eq!(outcomes.iter().filter(|ok| **ok).count(), 1, "{a:?} {b:?}");
        let refused = if a.1.is_ok() { &b } else { &a };
        assert!(
            matches!(refused.1, Err(StoreError::LastAdmin(_))),
            "{refused:?}"
        );
        survivor = refused.0.clone();
    }
    let left = store.key(&survivor).await.unwrap().unwrap();
    assert!(left.admin && left.revoked_unix_ms.is_none());
}

async fn keys_authenticate_and_fail_with_the_right_variant(db: Db) {
    let store = db.open().await;
    let acme = t("acme");
    store.create_tenant(&acme, Quotas::default()).await.unwrap();
    assert!(matches!(
        store.create_key(&t("nobody"), false, None).await,
        Err(StoreError::NotFound { what: "tenant", .. })
    ));
    let k = store
        .create_key(&acme, false, Some("laptop"))
        .await
        .unwrap();
    assert_eq!(keys::parse(&k.key), Some(k.info.id.as_str()));
    assert!(!k.info.admin);

    let p = store.authenticate(Some(&bearer(&k.key))).await.unwrap();
    assert_eq!(p.tenant, acme);
    assert_eq!(p.key_id, k.info.id);
    assert!(!p.admin);

    // Missing.
    let e = store.authenticate(None).await.unwrap_err();
    assert!(matches!(e, AuthError::Missing));
    assert_eq!((e.key_id(), e.tenant()), (None, None));
    // Malformed: not exactly "Bearer <key>".
    for h in [
        String::new(),
        k.key.clone(),
        format!("bearer {}", k.key),
        format!("Bearer  {}", k.key),
        format!("Bearer {} ", k.key),
        format!("Basic {}", k.key),
        "Bearer ".to_string(),
        "Bearer space_".to_string(),
        format!("Bearer {}", &k.key[..k.key.len() - 1]),
    ] {
        let e = store.authenticate(Some(&h)).await.unwrap_err();
        assert!(matches!(e, AuthError::Malformed), "{h:?}: {e:?}");
        assert_eq!(e.key_id(), None);
    }
    // Unknown id.
    let (stranger_id, stranger) = keys::generate();
    let e = store
        .authenticate(Some(&bearer(&stranger)))
        .await
        .unwrap_err();
    assert!(matches!(&e, AuthError::Unknown { key_id } if *key_id == stranger_id));
    assert_eq!(e.key_id(), Some(stranger_id.as_str()));
    assert_eq!(e.tenant(), None);
    // Known id, wrong secret: unknown as well, with no tenant.
    let mut wrong = k.key.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'a' { 'b' } else { 'a' });
    let e = store.authenticate(Some(&bearer(&wrong))).await.unwrap_err();
    assert!(matches!(&e, AuthError::Unknown { key_id } if *key_id == k.info.id));
    assert_eq!(e.tenant(), None);

    // Revoked: the right key stops working; revoking again keeps the first time.
    let revoked = store.revoke_key(&k.info.id).await.unwrap();
    let at = revoked.revoked_unix_ms.expect("revocation time");
    let e = store.authenticate(Some(&bearer(&k.key))).await.unwrap_err();
    assert!(matches!(&e, AuthError::Revoked { .. }));
    assert_eq!(e.key_id(), Some(k.info.id.as_str()));
    assert_eq!(e.tenant(), Some(&acme));
    std::thread::sleep(Duration::from_millis(5));
    let again = store.revoke_key(&k.info.id).await.unwrap();
    assert_eq!(again.revoked_unix_ms, Some(at));
    assert_eq!(store.key(&k.info.id).await.unwrap().unwrap(), again);
    // A wrong secret for a revoked key is still just unknown.
    let e = store.authenticate(Some(&bearer(&wrong))).await.unwrap_err();
    assert!(matches!(e, AuthError::Unknown { .. }));

    // Other keys of the tenant are unaffected.
    let admin = store.create_key(&acme, true, None).await.unwrap();
    assert!(
        store
            .authenticate(Some(&bearer(&admin.key)))
            .await
            .unwrap()
            .admin
    );
    let listed = store.keys(&acme).await.unwrap();
    assert_eq!(listed, vec![again, admin.info.clone()]);

    // Lookups of unknown and malformed ids.
    assert_eq!(store.key(&stranger_id).await.unwrap(), None);
    assert!(matches!(
        store.revoke_key(&stranger_id).await,
        Err(StoreError::NotFound { what: "key", .. })
    ));
    assert!(matches!(
        store.key("K123").await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.revoke_key("k' OR 1=1 --xxxx").await,
        Err(StoreError::Invalid(_))
    ));
}

#[tokio::test]
async fn the_key_is_never_stored() {
    let (_dir, path, store) = temp_store();
    store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    let k = store.create_key(&t("acme"), false, None).await.unwrap();
    let secret = &k.key[k.key.len() - keys::SECRET_LEN..];
    drop(store);
    let mut bytes = fs::read(&path).unwrap();
    if let Ok(wal) = fs::read(path.with_extension("db-wal")) {
        bytes.extend(wal);
    }
    let needle = secret.as_bytes();
    assert!(!bytes.windows(needle.len()).any(|w| w == needle));
    let hash = keys::hash(&k.key);
    assert!(bytes.windows(hash.len()).any(|w| w == hash.as_bytes()));
}

async fn labels_are_bounded(db: Db) {
    let store = db.open().await;
    store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    let long = "é".repeat(MAX_LABEL_CHARS);
    let k = store
        .create_key(&t("acme"), false, Some(&long))
        .await
        .unwrap();
    assert_eq!(k.info.label.as_deref(), Some(long.as_str()));
    let too_long = "x".repeat(MAX_LABEL_CHARS + 1);
    assert!(matches!(
        store.create_key(&t("acme"), false, Some(&too_long)).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store
            .create_key(&t("acme"), false, Some("a\u{1b}[2J"))
            .await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(store.keys(&t("acme")).await.unwrap().len(), 1);
}

async fn bootstrap_happens_once(db: Db) {
    let store = db.open().await;
    let default = t("default");
    let first = store
        .bootstrap(&default)
        .await
        .unwrap()
        .expect("first bootstrap");
    assert!(first.info.admin);
    assert_eq!(first.info.label.as_deref(), Some("bootstrap"));
    assert_eq!(first.info.tenant, default);
    assert_eq!(
        store.tenant(&default).await.unwrap().unwrap().quotas,
        Quotas::default()
    );
    assert!(
        store
            .authenticate(Some(&bearer(&first.key)))
            .await
            .unwrap()
            .admin
    );
    assert_eq!(store.bootstrap(&default).await.unwrap(), None);
    drop(store);
    let store = db.open().await;
    assert_eq!(store.bootstrap(&default).await.unwrap(), None);
    assert_eq!(store.bootstrap(&t("other")).await.unwrap(), None);
    assert_eq!(store.tenants().await.unwrap().len(), 1);
    assert_eq!(store.keys(&default).await.unwrap().len(), 1);

    // A store that already has a tenant, but not the bootstrap one, is left alone too.
    let store = db.another().open().await;
    store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    assert_eq!(store.bootstrap(&default).await.unwrap(), None);
    assert_eq!(store.tenant(&default).await.unwrap(), None);
}

async fn sandbox_ownership_is_per_tenant(db: Db) {
    let store = db.open().await;
    let (a, b) = (t("a"), t("b"));
    store.create_tenant(&a, Quotas::default()).await.unwrap();
    store.create_tenant(&b, Quotas::default()).await.unwrap();
    store.add_sandbox("sb-a1", &a).await.unwrap();
    store.add_sandbox("sb-b1", &b).await.unwrap();
    store.add_sandbox("sb-a2", &a).await.unwrap();
    assert!(matches!(
        store.add_sandbox("sb-a1", &b).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store.add_sandbox("sb-x", &t("nobody")).await,
        Err(StoreError::NotFound { what: "tenant", .. })
    ));
    for bad in ["", "sb/../x", "sb x", &"a".repeat(MAX_SANDBOX_ID_BYTES + 1)] {
        assert!(
            matches!(
                store.add_sandbox(bad, &a).await,
                Err(StoreError::Invalid(_))
            ),
            "{bad:?}"
        );
    }
    assert_eq!(
        store.sandbox_tenant("sb-a1").await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(
        store.sandbox_tenant("sb-b1").await.unwrap(),
        Some(b.clone())
    );
    assert_eq!(store.sandbox_tenant("sb-none").await.unwrap(), None);
    assert_eq!(store.sandboxes_of(&a).await.unwrap(), ["sb-a1", "sb-a2"]);
    assert_eq!(store.sandboxes_of(&b).await.unwrap(), ["sb-b1"]);
    assert!(store.sandboxes_of(&t("nobody")).await.unwrap().is_empty());
    assert_eq!(
        store.owned_sandboxes().await.unwrap(),
        vec![
            ("sb-a1".to_string(), a.clone()),
            ("sb-b1".to_string(), b.clone()),
            ("sb-a2".to_string(), a.clone()),
        ]
    );
    assert!(store.remove_sandbox("sb-a1").await.unwrap());
    assert!(!store.remove_sandbox("sb-a1").await.unwrap());
    assert_eq!(store.sandboxes_of(&a).await.unwrap(), ["sb-a2"]);
}

fn event(tenant: Option<&TenantName>, sandbox: Option<&str>, op: &str) -> NewAuditEvent {
    NewAuditEvent {
        tenant: tenant.cloned(),
        key_id: None,
        sandbox: sandbox.map(str::to_owned),
        operation: op.into(),
        result: "ok".into(),
        detail: None,
    }
}

async fn audit_queries_are_isolated_and_filtered(db: Db) {
    let store = db.open().await;
    let (a, b) = (t("a"), t("b"));
    let e1 = store
        .record(event(Some(&a), Some("sb-1"), "sandbox.create"))
        .await
        .unwrap();
    let e2 = store
        .record(event(Some(&b), Some("sb-2"), "sandbox.create"))
        .await
        .unwrap();
    let e3 = store.record(event(None, None, "auth")).await.unwrap();
    let e4 = store
        .record(event(Some(&a), Some("sb-1"), "sandbox.pause"))
        .await
        .unwrap();
    let e5 = store
        .record(event(Some(&a), Some("sb-3"), "sandbox.create"))
        .await
        .unwrap();
    let store = &store;
    let ids = |f: AuditFilter| async move {
        let got = store.audit(&f).await.unwrap();
        got.into_iter().map(|e| e.id).collect::<Vec<i64>>()
    };
    // Admin: everything, newest first, including tenantless events.
    assert_eq!(ids(AuditFilter::default()).await, [e5, e4, e3, e2, e1]);
    // A tenant sees only its own.
    let of_a = AuditFilter {
        tenant: Some(a.clone()),
        ..Default::default()
    };
    assert_eq!(ids(of_a.clone()).await, [e5, e4, e1]);
    assert_eq!(
        ids(AuditFilter {
            tenant: Some(b.clone()),
            ..Default::default()
        })
        .await,
        [e2]
    );
    // Another tenant's sandbox id does not leak through the sandbox filter.
    assert!(ids(AuditFilter {
        sandbox: Some("sb-2".into()),
        ..of_a.clone()
    })
    .await
    .is_empty());
    assert_eq!(
        ids(AuditFilter {
            sandbox: Some("sb-1".into()),
            ..of_a.clone()
        })
        .await,
        [e4, e1]
    );
    assert_eq!(
        ids(AuditFilter {
            operation: Some("sandbox.create".into()),
            ..of_a.clone()
        })
        .await,
        [e5, e1]
    );
    assert_eq!(
        ids(AuditFilter {
            operation: Some("auth".into()),
            ..Default::default()
        })
        .await,
        [e3]
    );
    // Limits are clamped to 1..=1000.
    assert_eq!(
        ids(AuditFilter {
            limit: 2,
            ..Default::default()
        })
        .await,
        [e5, e4]
    );
    assert_eq!(
        ids(AuditFilter {
            limit: 0,
            ..Default::default()
        })
        .await,
        [e5]
    );
    // since: everything is at or after "now minus a minute", nothing is in the future.
    let now = now_ms();
    assert_eq!(
        ids(AuditFilter {
            since_unix_ms: Some(now - 60_000),
            ..of_a.clone()
        })
        .await
        .len(),
        3
    );
    assert!(ids(AuditFilter {
        since_unix_ms: Some(now + 60_000),
        ..Default::default()
    })
    .await
    .is_empty());
    let all = store.audit(&AuditFilter::default()).await.unwrap();
    assert!(all
        .iter()
        .all(|e| e.at_unix_ms <= now_ms() && e.at_unix_ms + 60_000 > now));
}

async fn audit_limit_caps_at_1000(db: Db) {
    let store = db.open().await;
    for _ in 0..1005 {
        store.record(event(None, None, "auth")).await.unwrap();
    }
    let got = store
        .audit(&AuditFilter {
            limit: u32::MAX,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(got.len(), 1000);
    assert!(got.windows(2).all(|w| w[0].id > w[1].id));
}

async fn audit_fields_are_bounded(db: Db) {
    let store = db.open().await;
    // 'é' is two bytes, so a cut at 4096 bytes falls between characters of "xé…".
    let detail = format!("x{}", "é".repeat(MAX_DETAIL_BYTES));
    let id = store
        .record(NewAuditEvent {
            tenant: None,
            key_id: Some("k".repeat(1000)),
            sandbox: Some("s".repeat(1000)),
            operation: "o".repeat(1000),
            result: "r".repeat(1000),
            detail: Some(detail.clone()),
        })
        .await
        .unwrap();
    let got = store.audit(&AuditFilter::default()).await.unwrap();
    assert_eq!(got.len(), 1);
    let e = &got[0];
    assert_eq!(e.id, id);
    let d = e.detail.as_deref().unwrap();
    assert_eq!(d.len(), MAX_DETAIL_BYTES - 1);
    assert!(detail.starts_with(d));
    assert_eq!(e.operation.len(), MAX_AUDIT_FIELD_BYTES);
    assert_eq!(e.result.len(), MAX_AUDIT_FIELD_BYTES);
    assert_eq!(e.key_id.as_ref().unwrap().len(), MAX_AUDIT_FIELD_BYTES);
    assert_eq!(e.sandbox.as_ref().unwrap().len(), MAX_AUDIT_FIELD_BYTES);
    let v = serde_json::to_value(e).unwrap();
    for f in [
        "id",
        "at_unix_ms",
        "tenant",
        "key_id",
        "sandbox",
        "operation",
        "result",
        "detail",
    ] {
        assert!(v.get(f).is_some(), "{f} missing");
    }
}

async fn concurrent_writers_share_one_store(db: Db) {
    let store = std::sync::Arc::new(db.open().await);
    store
        .create_tenant(&t("acme"), Quotas::default())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                for j in 0..25 {
                    store
                        .add_sandbox(&format!("sb-{i}-{j}"), &t("acme"))
                        .await
                        .unwrap();
                    store
                        .record(event(Some(&t("acme")), None, "sandbox.create"))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(store.sandboxes_of(&t("acme")).await.unwrap().len(), 200);
    assert_eq!(
        store
            .audit(&AuditFilter {
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap()
            .len(),
        200
    );
}

#[tokio::test]
async fn a_version_1_database_migrates_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute("INSERT INTO tenants VALUES ('acme', 1, 5, 6, 7)", [])
            .unwrap();
        conn.execute(
            "INSERT INTO sandboxes VALUES ('sbx-0011223344556677', 'acme', 2)",
            [],
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let version: i64 = store
        .sqlite_conn()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, i64::from(SCHEMA_VERSION));
    assert_eq!(SCHEMA_VERSION, 12);
    let acme = t("acme");
    assert_eq!(
        store.tenant(&acme).await.unwrap().unwrap().quotas.max_vcpus,
        6
    );
    assert_eq!(
        store.sandbox_tenant("sbx-0011223344556677").await.unwrap(),
        Some(acme.clone())
    );
    // The new tables work.
    let (p, replaced) = store
        .expose_port("sbx-0011223344556677", 8000, "h1")
        .await
        .unwrap();
    assert!(!replaced);
    assert_eq!(p.port, 8000);
    assert!(store.secrets(&acme).await.unwrap().is_empty());
    assert!(store.volumes(&acme).await.unwrap().is_empty());
    assert!(store.e2b_secrets(&acme).await.unwrap().is_empty());
    let quotas = store.tenant(&acme).await.unwrap().unwrap().quotas;
    assert_eq!(quotas.max_volume_mib, crate::store::DEFAULT_MAX_VOLUME_MIB);
}

async fn ports_are_looked_up_by_token_hash_and_replaced(db: Db) {
    let store = db.open().await;
    let a = t("a");
    store.create_tenant(&a, Quotas::default()).await.unwrap();
    store.add_sandbox("sbx-1", &a).await.unwrap();
    assert!(matches!(
        store.expose_port("sbx-2", 80, "x").await,
        Err(StoreError::NotFound {
            what: "sandbox",
            ..
        })
    ));
    store.expose_port("sbx-1", 8000, "h1").await.unwrap();
    store.expose_port("sbx-1", 80, "h2").await.unwrap();
    let (p, owner) = store.port_by_token("h1").await.unwrap().unwrap();
    assert_eq!(
        (p.sandbox.as_str(), p.port, owner),
        ("sbx-1", 8000, a.clone())
    );
    // Exposing again replaces the token: the old one stops working.
    let (_, replaced) = store.expose_port("sbx-1", 8000, "h3").await.unwrap();
    assert!(replaced);
    assert_eq!(store.port_by_token("h1").await.unwrap(), None);
    assert!(store.port_by_token("h3").await.unwrap().is_some());
    let ports: Vec<u16> = store
        .ports("sbx-1")
        .await
        .unwrap()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [80, 8000]);
    assert!(store.unexpose_port("sbx-1", 80).await.unwrap());
    assert!(!store.unexpose_port("sbx-1", 80).await.unwrap());
    assert_eq!(store.port_by_token("h2").await.unwrap(), None);
    // Forgetting the sandbox drops its ports.
    assert!(store.remove_sandbox("sbx-1").await.unwrap());
    assert_eq!(store.port_by_token("h3").await.unwrap(), None);
}

mod cluster;
mod e2b_secrets;
mod idempotency;
mod postgres;
mod templates;

async fn volumes_are_the_tenants_and_unique_by_name(db: Db) {
    let store = db.open().await;
    let (a, b) = (t("a"), t("b"));
    store.create_tenant(&a, Quotas::default()).await.unwrap();
    store.create_tenant(&b, Quotas::default()).await.unwrap();
    let row = |id: &str, tenant: &TenantName, name: &str| VolumeRow {
        id: id.into(),
        tenant: tenant.clone(),
        name: name.into(),
        size_bytes: 1 << 30,
        node: None,
        created_unix_ms: 7,
    };
    store
        .insert_volume(&row("vol-0000000000000001", &a, "data"))
        .await
        .unwrap();
    // Another tenant may use the name; the same tenant may not.
    store
        .insert_volume(&row("vol-0000000000000002", &b, "data"))
        .await
        .unwrap();
    assert!(matches!(
        store
            .insert_volume(&row("vol-0000000000000003", &a, "data"))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store
            .insert_volume(&row("vol-0000000000000004", &t("nobody"), "x"))
            .await,
        Err(StoreError::NotFound { .. })
    ));
    store
        .insert_volume(&row("vol-0000000000000005", &a, "cache"))
        .await
        .unwrap();
    let names: Vec<String> = store
        .volumes(&a)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["cache", "data"]);
    assert_eq!(store.volume_bytes(&a).await.unwrap(), 2 << 30);
    let got = store.volume(&b, "data").await.unwrap().unwrap();
    assert_eq!(got.id, "vol-0000000000000002");
    assert!(store.volume(&b, "cache").await.unwrap().is_none());
    store
        .set_volume_node("vol-0000000000000002", "n1")
        .await
        .unwrap();
    let got = store
        .volume_by_id("vol-0000000000000002")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got.node.as_deref(), got.created_unix_ms), (Some("n1"), 7));
    assert!(store.delete_volume("vol-0000000000000002").await.unwrap());
    assert!(!store.delete_volume("vol-0000000000000002").await.unwrap());
    assert!(store
        .volume_by_id("vol-0000000000000002")
        .await
        .unwrap()
        .is_none());
}
