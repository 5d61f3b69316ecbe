# SPDX-License-Identifier: Apache-2.0
include(CMakePackageConfigHelpers)
install(DIRECTORY include/diffusion_gemma DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS diffusion_gemma EXPORT diffusion_gemmaTargets)
set(_dg_cmake_dir ${CMAKE_INSTALL_DATADIR}/cmake/diffusion_gemma)
install(EXPORT diffusion_gemmaTargets NAMESPACE diffusion_gemma:: DESTINATION ${_dg_cmake_dir})
if(TARGET diffusion_gemma_cuda)
  install(TARGETS diffusion_gemma_cuda EXPORT diffusion_gemmaCudaTargets)
  install(EXPORT diffusion_gemmaCudaTargets NAMESPACE diffusion_gemma:: DESTINATION ${_dg_cmake_dir})
endif()
configure_package_config_file(cmake/diffusion_gemmaConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/diffusion_gemmaConfig.cmake INSTALL_DESTINATION ${_dg_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/diffusion_gemmaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/diffusion_gemmaConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/diffusion_gemmaConfigVersion.cmake
        DESTINATION ${_dg_cmake_dir})
