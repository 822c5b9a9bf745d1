//! Reading `INFO` replies.

/// The value of `field` in the text of an `INFO` reply (`field:value` lines), if present.
///
/// ```
/// let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n";
/// assert_eq!(sluice_testkit::parse_info_field(info, "connected_slaves"), Some("2"));
/// assert_eq!(sluice_testkit::parse_info_field(info, "connected"), None);
/// ```
pub fn parse_info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            (name == field).then(|| value.trim_end())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exact_fields_only() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:42\r\n\r\n# Replication\r\n\
                    slave0:ip=127.0.0.1,port=1,state=online,offset=5,lag=0\r\n";
        assert_eq!(parse_info_field(info, "process_id"), Some("42"));
        assert_eq!(parse_info_field(info, "redis_version"), Some("7.0.15"));
        assert_eq!(
            parse_info_field(info, "slave0"),
            Some("ip=127.0.0.1,port=1,state=online,offset=5,lag=0")
        );
        assert_eq!(parse_info_field(info, "process"), None);
        assert_eq!(parse_info_field(info, "# Server"), None);
        assert_eq!(parse_info_field("", "x"), None);
    }
}
