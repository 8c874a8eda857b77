//! The AWS KMS API as a master key provider: tenant keys are made with `GenerateDataKey`,
//! opened with `Decrypt`, moved between KMS keys with `ReEncrypt` and wrapped anew with
//! `Encrypt`, always with the tenant as encryption context. Speaks the JSON protocol
//! (`X-Amz-Target: TrentService.*`) signed with Signature Version 4, so it works with AWS
//! and with KMS-compatible services (an endpoint URL).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::crypto::Key;
use crate::keys::{BoxFuture, KeyError, MasterKey};

/// The id prefix of KMS master keys.
pub const ID_PREFIX: &str = "kms:";

/// Where and as whom to reach KMS.
#[derive(Clone, PartialEq, Eq)]
pub struct KmsConfig {
    /// The key: id, ARN or alias.
    pub key_id: String,
    /// Region (`us-east-1`).
    pub region: String,
    /// Endpoint URL; `None`: `https://kms.<region>.amazonaws.com`.
    pub endpoint: Option<String>,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token, for temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for KmsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KmsConfig")
            .field("key_id", &self.key_id)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// A KMS key as a master key.
pub struct KmsMaster {
    config: KmsConfig,
    http: reqwest::Client,
}

type HmacSha256 = Hmac<Sha256>;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn hex_sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// `YYYYMMDD'T'HHMMSS'Z'` for `t`.
fn amz_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl KmsMaster {
    /// A provider for `config`.
    pub fn new(config: KmsConfig) -> Result<KmsMaster, KeyError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| KeyError::Master {
                key: format!("kms:{}", config.key_id),
                tenant: String::new(),
                detail: e.to_string(),
            })?;
        Ok(KmsMaster { config, http })
    }

    fn endpoint(&self) -> String {
        self.config
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("https://kms.{}.amazonaws.com", self.config.region))
    }

    /// One signed call of the KMS JSON API.
    pub async fn call(&self, tenant: &str, action: &str, body: Value) -> Result<Value, KeyError> {
        let err = |detail: String| KeyError::Master {
            key: self.id(),
            tenant: tenant.to_owned(),
            detail,
        };
        let url =
            reqwest::Url::parse(&self.endpoint()).map_err(|e| err(format!("endpoint: {e}")))?;
        let host = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_owned(),
            _ => return Err(err("the endpoint has no host".into())),
        };
        let payload = serde_json::to_vec(&body).expect("JSON serializes");
        let now = amz_date(SystemTime::now());
        let date = &now[..8];
        let target = format!("TrentService.{action}");
        let content_type = "application/x-amz-json-1.1";
        let mut headers: Vec<(&str, String)> = vec![
            ("content-type", content_type.into()),
            ("host", host.clone()),
            ("x-amz-date", now.clone()),
            ("x-amz-target", target.clone()),
        ];
        if let Some(t) = &self.config.session_token {
            headers.push(("x-amz-security-token", t.clone()));
        }
        headers.sort_by(|a, b| a.0.cmp(b.0));
        let canonical_headers: String = headers
            .iter()
            .map(|(k, v)| format!("{k}:{}\n", v.trim()))
            .collect();
        let signed: String = headers
            .iter()
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
            .join(";");
        let path = if url.path().is_empty() {
            "/"
        } else {
            url.path()
        };
        let canonical = format!(
            "POST\n{path}\n\n{canonical_headers}\n{signed}\n{}",
            hex_sha256(&payload)
        );
        let scope = format!("{date}/{}/kms/aws4_request", self.config.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{now}\n{scope}\n{}",
            hex_sha256(canonical.as_bytes())
        );
        let k_date = hmac(
            format!("AWS4{}", self.config.secret_access_key).as_bytes(),
            date.as_bytes(),
        );
        let k_region = hmac(&k_date, self.config.region.as_bytes());
        let k_service = hmac(&k_region, b"kms");
        let k_signing = hmac(&k_service, b"aws4_request");
        let signature = hex::encode(hmac(&k_signing, to_sign.as_bytes()));
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            self.config.access_key_id
        );
        let mut req = self
            .http
            .post(url)
            .header("content-type", content_type)
            .header("x-amz-date", &now)
            .header("x-amz-target", &target)
            .header("authorization", auth);
        if let Some(t) = &self.config.session_token {
            req = req.header("x-amz-security-token", t);
        }
        let resp = req
            .body(payload)
            .send()
            .await
            .map_err(|e| err(format!("{action}: {e}")))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| err(format!("{action}: {e}")))?;
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let kind = v["__type"].as_str().unwrap_or("error");
            let kind = kind.rsplit('#').next().unwrap_or(kind);
            let msg = v["message"]
                .as_str()
                .or_else(|| v["Message"].as_str())
                .unwrap_or("");
            return Err(err(format!("{action} refused ({status}): {kind}: {msg}")));
        }
        Ok(v)
    }

    /// Refuses a key that is not `Enabled` (disabled, pending deletion, ...), with its state.
    /// AWS refuses such keys in every cryptographic call anyway; asking first gives the same
    /// clear error from services that do not check the state themselves.
    async fn check_enabled(&self, tenant: &str) -> Result<(), KeyError> {
        let v = self
            .call(
                tenant,
                "DescribeKey",
                json!({ "KeyId": self.config.key_id }),
            )
            .await?;
        match v["KeyMetadata"]["KeyState"].as_str() {
            Some("Enabled") => Ok(()),
            state => Err(KeyError::Master {
                key: self.id(),
                tenant: tenant.to_owned(),
                detail: format!(
                    "the KMS key is {} (its data cannot be opened until it is enabled again)",
                    state.unwrap_or("in an unknown state")
                ),
            }),
        }
    }

    fn context(tenant: &str) -> Value {
        json!({ "space-tenant": tenant })
    }

    fn blob(&self, tenant: &str, v: &Value, field: &str) -> Result<Vec<u8>, KeyError> {
        v[field]
            .as_str()
            .and_then(|s| b64().decode(s).ok())
            .ok_or_else(|| KeyError::Master {
                key: self.id(),
                tenant: tenant.to_owned(),
                detail: format!("the answer has no {field}"),
            })
    }

    /// Moves a wrapped tenant key from this KMS key to `to` inside KMS (`ReEncrypt`): the
    /// tenant key never leaves KMS in the clear.
    pub async fn reencrypt(
        &self,
        tenant: &str,
        wrapped: &[u8],
        to: &KmsMaster,
    ) -> Result<Vec<u8>, KeyError> {
        let v = self
            .call(
                tenant,
                "ReEncrypt",
                json!({
                    "CiphertextBlob": b64().encode(wrapped),
                    "SourceEncryptionContext": Self::context(tenant),
                    "SourceKeyId": self.config.key_id,
                    "DestinationKeyId": to.config.key_id,
                    "DestinationEncryptionContext": Self::context(tenant),
                }),
            )
            .await?;
        self.blob(tenant, &v, "CiphertextBlob")
    }
}

impl MasterKey for KmsMaster {
    fn id(&self) -> String {
        format!("{ID_PREFIX}{}", self.config.key_id)
    }

    fn describe(&self) -> crate::keys::MasterDescription {
        crate::keys::MasterDescription {
            id: self.id(),
            region: Some(self.config.region.clone()),
            endpoint: self.config.endpoint.clone(),
        }
    }

    fn generate<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<(Key, Vec<u8>), KeyError>> {
        Box::pin(async move {
            self.check_enabled(tenant).await?;
            let v = self
                .call(
                    tenant,
                    "GenerateDataKey",
                    json!({
                        "KeyId": self.config.key_id,
                        "KeySpec": "AES_256",
                        "EncryptionContext": Self::context(tenant),
                    }),
                )
                .await?;
            let plain = self.blob(tenant, &v, "Plaintext")?;
            let wrapped = self.blob(tenant, &v, "CiphertextBlob")?;
            let key = Key::from_slice(&plain).map_err(|e| KeyError::Master {
                key: self.id(),
                tenant: tenant.to_owned(),
                detail: e.to_string(),
            })?;
            Ok((key, wrapped))
        })
    }

    fn wrap<'a>(
        &'a self,
        tenant: &'a str,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Vec<u8>, KeyError>> {
        Box::pin(async move {
            let v = self
                .call(
                    tenant,
                    "Encrypt",
                    json!({
                        "KeyId": self.config.key_id,
                        "Plaintext": b64().encode(key.as_bytes()),
                        "EncryptionContext": Self::context(tenant),
                    }),
                )
                .await?;
            self.blob(tenant, &v, "CiphertextBlob")
        })
    }

    fn unwrap<'a>(
        &'a self,
        tenant: &'a str,
        wrapped: &'a [u8],
    ) -> BoxFuture<'a, Result<Key, KeyError>> {
        Box::pin(async move {
            self.check_enabled(tenant).await?;
            let v = self
                .call(
                    tenant,
                    "Decrypt",
                    json!({
                        "KeyId": self.config.key_id,
                        "CiphertextBlob": b64().encode(wrapped),
                        "EncryptionContext": Self::context(tenant),
                    }),
                )
                .await?;
            let plain = self.blob(tenant, &v, "Plaintext")?;
            Key::from_slice(&plain).map_err(|e| KeyError::Master {
                key: self.id(),
                tenant: tenant.to_owned(),
                detail: e.to_string(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(amz_date(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        assert_eq!(amz_date(t), "20150830T123600Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(amz_date(leap), "20000229T000000Z");
    }

    #[test]
    fn signing_key_matches_the_published_derivation() {
        // AWS's documented example: secret wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY,
        // 20150830, us-east-1, iam.
        let k = hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20150830");
        let k = hmac(&k, b"us-east-1");
        let k = hmac(&k, b"iam");
        let k = hmac(&k, b"aws4_request");
        assert_eq!(
            hex::encode(k),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
    }

    #[test]
    fn secrets_do_not_print() {
        let c = KmsConfig {
            key_id: "k".into(),
            region: "r".into(),
            endpoint: None,
            access_key_id: "AKID".into(),
            secret_access_key: "hunter2".into(),
            session_token: Some("tok".into()),
        };
        let s = format!("{c:?}");
        assert!(!s.contains("hunter2") && !s.contains("tok"), "{s}");
    }
}
