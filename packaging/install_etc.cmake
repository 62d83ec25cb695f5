# Runs at install time (install(SCRIPT) in packaging/CMakeLists.txt), when the final
# prefix is known: CMAKE_INSTALL_PREFIX (without DESTDIR, which file(INSTALL) prepends).
# For prefix /usr the config goes to /etc/kvtier (the .deb), else to <prefix>/etc/kvtier.
# The unit's ExecStart names the installed kvtierd and config.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(_etc "/etc")
else()
  set(_etc "${CMAKE_INSTALL_PREFIX}/etc")
endif()
set(KVTIER_CONFIG_PATH "${_etc}/kvtier/kvtier.toml")
set(KVTIER_KVTIERD "${CMAKE_INSTALL_PREFIX}/${KVTIER_BINDIR}/kvtierd")

# One rendering folder per (DESTDIR, prefix): installs into several prefixes may run at once.
string(MD5 _key "$ENV{DESTDIR}|${CMAKE_INSTALL_PREFIX}")
set(_out "${KVTIER_BINARY_DIR}/rendered/${_key}")
configure_file("${KVTIER_SOURCE_DIR}/kvtierd.service.in" "${_out}/kvtierd.service" @ONLY)

file(INSTALL "${KVTIER_BINARY_DIR}/kvtier.toml" DESTINATION "${_etc}/kvtier")
file(INSTALL "${_out}/kvtierd.service" DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")
